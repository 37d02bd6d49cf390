//! rtx-scheduler
