//! Bytes from the network through everything the DHCP server does with them: framing checks,
//! dhcproto decoding as we call it, the pure core (allocation, PXE decision) and encoding.
#![no_main]

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::Mutex;

use libfuzzer_sys::fuzz_target;
use paddock_dhcp::{AllowAll, BootPolicy, Leases, Server, ServerConfig, Subnet};

static SERVER: Mutex<Option<Server>> = Mutex::new(None);

fn server() -> Server {
    let subnet = |net: &str, a: [u8; 4], b: [u8; 4]| Subnet {
        routers: vec![Ipv4Addr::new(198, 18, 0, 1)],
        domain: Some("lab".into()),
        ..Subnet::with_pool(net.parse().unwrap(), a.into(), b.into(), 600)
    };
    let leases = Leases::new(
        vec![
            subnet("198.18.0.0/24", [198, 18, 0, 10], [198, 18, 0, 20]),
            subnet("0.0.0.0/8", [0, 0, 0, 1], [0, 0, 0, 9]),
        ],
        vec![],
    )
    .unwrap();
    let mut arch = BTreeMap::new();
    arch.insert(2, "x".repeat(200));
    Server::new(
        leases,
        ServerConfig {
            boot: BootPolicy::new("http://198.18.0.1:8080", &arch),
            client_port: 68,
            relay_port: 67,
        },
    )
}

fuzz_target!(|data: &[u8]| {
    let Ok(msg) = paddock_dhcp::packet::decode_request(data) else {
        return;
    };
    let mut guard = SERVER.lock().unwrap();
    let s = guard.get_or_insert_with(server);
    let now = u64::from(data.len() as u32) * 7;
    let out = s.handle(&msg, Ipv4Addr::new(198, 18, 0, 1), now, &AllowAll);
    if let Some((reply, _)) = out.reply {
        paddock_dhcp::packet::encode(&reply).expect("our replies always encode");
    }
});
