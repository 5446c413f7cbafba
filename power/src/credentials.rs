//! BMC credentials. The password is a [`Secret`]: its `Debug` prints `"***"`, it has no
//! `Display` and no serde, so it reaches a log, an API answer or the console only through
//! [`Secret::expose`], which the drivers call at the one place they hand it to the BMC.

/// A password.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// The secret itself: for the request that sends it, nothing else.
    pub fn expose(&self) -> &str {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("\"***\"")
    }
}

/// A BMC user name and password.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: Secret,
}

impl Credentials {
    pub fn new(username: impl Into<String>, password: impl Into<String>) -> Credentials {
        Credentials {
            username: username.into(),
            password: Secret::new(password),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_the_password() {
        let c = Credentials::new("admin", "hunter2-very-secret");
        let shown = format!("{c:?} {c:#?} {:?}", c.password);
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("admin") && shown.contains("***"), "{shown}");
        assert_eq!(c.password.expose(), "hunter2-very-secret");
    }
}
