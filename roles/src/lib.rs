//! Roles: the role spec and the planning engine (issue 17). Being built.
