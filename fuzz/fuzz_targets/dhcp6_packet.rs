//! Bytes from the network through everything the DHCPv6 server does with them (the framing
//! walk, relay-forward unwrapping, dhcproto decoding as we call it, the pure core: allocation,
//! boot file URLs, and encoding of the reply, wrapped back for its relays), and through the
//! agent's DHCPv6 client as a server's answer.
#![no_main]

use std::net::Ipv6Addr;
use std::sync::Mutex;

use libfuzzer_sys::fuzz_target;
use paddock_dhcp::MacAddr;
use paddock_dhcp::v6::{
    Boot6, Leases6, Pool6, Reservation6, Server6, Server6Config, Subnet6, Via6,
};

static SERVER: Mutex<Option<Server6>> = Mutex::new(None);

fn server() -> Server6 {
    let subnet = Subnet6 {
        network: "2001:2:0:1::/64".parse().unwrap(),
        pools: vec![Pool6 {
            start: "2001:2:0:1::100".parse().unwrap(),
            end: "2001:2:0:1::10f".parse().unwrap(),
        }],
        dns: vec!["2001:2:0:1::1".parse().unwrap()],
        domain: Some("lab".into()),
        preferred_lifetime: 60,
        valid_lifetime: 120,
    };
    let leases = Leases6::new(
        vec![subnet],
        vec![Reservation6 {
            mac: MacAddr([0x52, 0x54, 0, 0, 0, 1]),
            ip: "2001:2:0:1::7".parse().unwrap(),
        }],
    )
    .unwrap();
    Server6::new(
        leases,
        Server6Config {
            duid: vec![0, 3, 0, 1, 2, 0, 0, 0, 0, 1],
            boot: Some(Boot6 {
                table: paddock_dhcp::pxe::default_table(),
                public_url: "http://[2001:2:0:1::1]:8080".into(),
            }),
        },
    )
}

/// The bytes as an answer to the agent's client, whose transaction they name.
fn as_answer(data: &[u8]) -> Option<()> {
    let xid = data.get(1..4)?;
    let n = u32::from_be_bytes([0, xid[0], xid[1], xid[2]]).wrapping_sub(1);
    let [_, a, b, c] = n.to_be_bytes();
    let mut client =
        paddock_dhcp::v6::Dhcp6Client::new(MacAddr([0x52, 0x54, 0, 0, 0, 1]), [a, b, c]);
    client.solicit(0).ok()?;
    if let paddock_dhcp::v6::Step6::Send(request) = client.receive(data, 1) {
        paddock_dhcp::v6::packet::decode_request6(&request).expect("our Request decodes");
    }
    Some(())
}

fuzz_target!(|data: &[u8]| {
    as_answer(data);
    let Ok(inbound) = paddock_dhcp::v6::packet::decode_inbound6(data) else {
        return;
    };
    let mut guard = SERVER.lock().unwrap();
    let s = guard.get_or_insert_with(server);
    let now = u64::from(data.len() as u32) * 7;
    let here: Ipv6Addr = "2001:2:0:1::1".parse().unwrap();
    let peer = "fe80::5054:ff:fe00:1".parse().unwrap();
    // Served on the link its relays name, as the shell does (none: not served).
    let Some(via) = Via6::through(here, peer, &inbound.relays) else {
        return;
    };
    let out = s.handle_via(&inbound.msg, &via, now * 1000, &paddock_dhcp::AllowAll);
    if let Some(reply) = out.reply {
        let bytes = paddock_dhcp::v6::packet::encode6(&reply).expect("our replies always encode");
        // Relays' interface-ids can make the answer too large for option 9: an error, no panic.
        let _ = paddock_dhcp::v6::packet::encode_relayed6(bytes, &inbound.relays);
    }
});
