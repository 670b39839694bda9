//! LTX-2 connectors (being ported).
