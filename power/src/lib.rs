//! Power control: one [`PowerDriver`] trait, a Redfish driver ([`redfish`]) and an
//! IPMI driver ([`ipmi`], through `ipmitool -I lanplus`), and the appliance-wide power-on
//! [`throttle`].
//!
//! Each driver is a pure core (requests and argument vectors built, answers parsed and
//! classified, all unit-tested against answers recorded from sushy-tools and virtualbmc under
//! `tests/fixtures/`) and a thin shell (`ureq`, or a child process). Calls block: the
//! appliance runs them on blocking threads. Failures carry an [`ErrorKind`] an operator can
//! act on; transient ones ([`ErrorKind::Unreachable`], [`ErrorKind::Busy`]) are retried a
//! bounded number of times ([`retry`]), the others never (a wrong password retried can lock
//! an account).

pub mod credentials;
mod http;
pub mod ipmi;
pub mod redfish;
pub mod retry;
pub mod settings;
pub mod text;
pub mod throttle;
mod transport;

pub use credentials::{Credentials, Secret};
pub use http::base_url;
pub use ipmi::{Ipmi, IpmiBmc};
pub use redfish::{Redfish, RedfishBmc, TlsVerify};
pub use retry::RetryPolicy;
pub use settings::bmc_from_driver_info;
pub use throttle::Throttle;

/// A machine's power as its BMC reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PowerState {
    On,
    Off,
    PoweringOn,
    PoweringOff,
}

impl PowerState {
    pub fn as_str(self) -> &'static str {
        match self {
            PowerState::On => "on",
            PowerState::Off => "off",
            PowerState::PoweringOn => "powering on",
            PowerState::PoweringOff => "powering off",
        }
    }
}

impl std::fmt::Display for PowerState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What went wrong, in the terms an operator acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// No answer: the address is wrong, the BMC is down, or the network does not reach it.
    Unreachable,
    /// The TLS handshake failed: the BMC's certificate does not verify (give its CA, or turn
    /// verification off for this BMC).
    Tls,
    /// The BMC refused the user name or password (HTTP 401/403, IPMI's RAKP errors).
    Credentials,
    /// The BMC does not offer this action (not among its allowable values, HTTP 404/405/501,
    /// IPMI "invalid command/data field").
    Unsupported,
    /// The BMC answered something this driver cannot read.
    BadAnswer,
    /// The BMC understood and refused (HTTP 400/409/412 …, an IPMI completion code).
    Refused,
    /// The BMC says it is busy or failed inside (HTTP 5xx, 429): worth retrying.
    Busy,
}

impl ErrorKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Unreachable => "BMC unreachable",
            ErrorKind::Tls => "TLS verification failed",
            ErrorKind::Credentials => "wrong BMC credentials",
            ErrorKind::Unsupported => "unsupported by the BMC",
            ErrorKind::BadAnswer => "bad answer from the BMC",
            ErrorKind::Refused => "refused by the BMC",
            ErrorKind::Busy => "BMC busy",
        }
    }

    /// Whether trying again later may succeed without anyone changing anything.
    pub fn transient(self) -> bool {
        matches!(self, ErrorKind::Unreachable | ErrorKind::Busy)
    }
}

/// A failed power operation: its kind, and a message saying what happened and what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {message}", kind.as_str())]
pub struct PowerError {
    pub kind: ErrorKind,
    pub message: String,
}

impl PowerError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> PowerError {
        PowerError {
            kind,
            message: message.into(),
        }
    }
}

/// A machine's BMC, driven by one protocol. Calls block (HTTP requests, `ipmitool`); each
/// is bounded by the driver's timeouts and retry policy.
pub trait PowerDriver: Send + Sync {
    /// The power state the BMC reports.
    fn status(&self) -> Result<PowerState, PowerError>;
    /// Powers the machine on; nothing to do if it is on.
    fn power_on(&self) -> Result<(), PowerError>;
    /// Powers the machine off at once (not a graceful shutdown); nothing to do if it is off.
    fn power_off(&self) -> Result<(), PowerError>;
    /// Restarts the machine: a hard reset if it is on, power on if it is off.
    fn reboot(&self) -> Result<(), PowerError>;
    /// Makes the next boot (only the next) a network (PXE) boot.
    fn boot_pxe_once(&self) -> Result<(), PowerError>;
}

/// Polls `driver` every `poll` until it reports `want` (a BMC answers a power action before
/// the machine has changed state), for at most `timeout`; then a [`ErrorKind::Busy`] error
/// saying what the machine still is. Status errors end the wait at once.
pub fn wait_for_state(
    driver: &dyn PowerDriver,
    want: PowerState,
    timeout: std::time::Duration,
    poll: std::time::Duration,
) -> Result<(), PowerError> {
    let start = std::time::Instant::now();
    loop {
        let now = driver.status()?;
        if now == want {
            return Ok(());
        }
        if start.elapsed() >= timeout {
            return Err(PowerError::new(
                ErrorKind::Busy,
                format!(
                    "the machine is still {now}, not {want}, {} s after the action",
                    timeout.as_secs()
                ),
            ));
        }
        std::thread::sleep(poll);
    }
}

/// A BMC and how to reach it.
#[derive(Debug, Clone)]
pub enum Bmc {
    Redfish(RedfishBmc),
    Ipmi(IpmiBmc),
}

impl Bmc {
    /// The driver for this BMC (a bad address or CA file is an error here, before any call).
    pub fn driver(&self, retry: RetryPolicy) -> Result<Box<dyn PowerDriver>, PowerError> {
        Ok(match self {
            Bmc::Redfish(b) => Box::new(Redfish::connect(b, retry)?),
            Bmc::Ipmi(b) => Box::new(Ipmi::new(b.clone(), retry)?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::time::Duration;

    /// Reports the states it is given, one per call, then the last one for ever.
    struct Reports(Mutex<Vec<PowerState>>);

    impl PowerDriver for Reports {
        fn status(&self) -> Result<PowerState, PowerError> {
            let mut v = self.0.lock().unwrap();
            Ok(if v.len() > 1 { v.remove(0) } else { v[0] })
        }
        fn power_on(&self) -> Result<(), PowerError> {
            unreachable!()
        }
        fn power_off(&self) -> Result<(), PowerError> {
            unreachable!()
        }
        fn reboot(&self) -> Result<(), PowerError> {
            unreachable!()
        }
        fn boot_pxe_once(&self) -> Result<(), PowerError> {
            unreachable!()
        }
    }

    #[test]
    fn waiting_for_a_state_polls_until_it_comes_or_the_time_is_up() {
        let ms = Duration::from_millis;
        let d = Reports(Mutex::new(vec![
            PowerState::Off,
            PowerState::PoweringOn,
            PowerState::On,
        ]));
        wait_for_state(&d, PowerState::On, ms(1000), ms(1)).unwrap();
        assert!(d.0.lock().unwrap().len() == 1, "all three reports read");
        let stuck = Reports(Mutex::new(vec![PowerState::PoweringOff]));
        let e = wait_for_state(&stuck, PowerState::Off, ms(20), ms(5)).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Busy);
        assert!(e.message.contains("still powering off, not off"), "{e}");
    }
}
