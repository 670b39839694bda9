//! LTX-2 video_vae (being ported).
