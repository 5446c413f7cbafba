//! `/init` of the Paddock introspection ramdisk. See the crate docs and `ramdisk/README.md`.

use paddock_ramdisk::console::Console;

static CONSOLE: Console = Console::new();

fn main() {
    // This program mounts file systems and powers the machine off: never run it by accident
    // on a host.
    if std::process::id() != 1 && std::env::var_os("PADDOCK_AGENT_FORCE").is_none_or(|v| v != "1") {
        eprintln!(
            "paddock-agent is the /init of the introspection ramdisk and must run as PID 1 \
             (it mounts /proc, /sys, /dev and powers the machine off). Set PADDOCK_AGENT_FORCE=1 to run it anyway."
        );
        std::process::exit(2);
    }
    // PID 1 must never exit: a panic is reported and the agent waits with it on the console.
    let r = std::panic::catch_unwind(|| paddock_ramdisk::agent::run(&CONSOLE));
    let msg = match r {
        Ok(never) => match never {},
        Err(p) => p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "unknown panic".into()),
    };
    CONSOLE.say(&format!("internal error (panic): {msg}; stopped"));
    loop {
        std::thread::sleep(std::time::Duration::from_secs(3600));
    }
}
