//! The C ABI of `csrc/shim.cpp`. Every function except the two frees returns NULL on success or a
//! malloc'd error message that [`take_error`] turns into a `String` (and frees).
use std::ffi::{c_char, CStr};
use torch_sys::C_tensor;

/// The shim's opaque process-group handle.
#[repr(C)]
pub struct Group {
    _private: [u8; 0],
}

extern "C" {
    pub fn ftd_free_error(error: *mut c_char);
    #[allow(clippy::too_many_arguments)]
    pub fn ftd_group_new(
        host: *const c_char,
        port: u16,
        serve_store: bool,
        prefix: *const c_char,
        rank: i32,
        size: i32,
        backend: i32,
        device: i64,
        timeout_ms: i64,
        out: *mut *mut Group,
    ) -> *mut c_char;
    pub fn ftd_group_free(group: *mut Group);
    pub fn ftd_all_reduce(group: *mut Group, t: *mut C_tensor, op: i32) -> *mut c_char;
    pub fn ftd_broadcast(group: *mut Group, t: *mut C_tensor, root: i32) -> *mut c_char;
    pub fn ftd_all_gather(
        group: *mut Group,
        out: *mut C_tensor,
        shard: *mut C_tensor,
    ) -> *mut c_char;
    pub fn ftd_reduce_scatter(
        group: *mut Group,
        out: *mut C_tensor,
        full: *mut C_tensor,
        op: i32,
    ) -> *mut c_char;
    pub fn ftd_barrier(group: *mut Group) -> *mut c_char;
    pub fn ftd_sub_group(
        parent: *mut Group,
        prefix: *const c_char,
        rank: i32,
        size: i32,
        out: *mut *mut Group,
    ) -> *mut c_char;
    pub fn ftd_all_to_all(
        group: *mut Group,
        out: *mut C_tensor,
        input: *mut C_tensor,
    ) -> *mut c_char;
    pub fn ftd_exchange(
        group: *mut Group,
        x: *mut C_tensor,
        scatter: i64,
        gather: i64,
        out: *mut *mut C_tensor,
    ) -> *mut c_char;
}

/// `Ok` for NULL, else the message, freeing the shim's string.
pub fn take_error(error: *mut c_char) -> Result<(), String> {
    if error.is_null() {
        return Ok(());
    }
    // SAFETY: a non-null return is a NUL-terminated string malloc'd by the shim, owned by us now.
    let message = unsafe { CStr::from_ptr(error) }.to_string_lossy().into_owned();
    unsafe { ftd_free_error(error) };
    Err(message)
}
