//! Power control (issue 19). Being built.
