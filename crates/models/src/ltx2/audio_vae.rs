//! LTX-2 audio_vae (being ported).
