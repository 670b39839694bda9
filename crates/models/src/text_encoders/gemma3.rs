//! Gemma-3's text decoder (being ported).
