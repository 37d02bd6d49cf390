//! rtx
