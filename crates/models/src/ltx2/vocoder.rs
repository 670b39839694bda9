//! LTX-2 vocoder (being ported).
