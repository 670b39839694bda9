//! LTX-2 transformer (being ported).
