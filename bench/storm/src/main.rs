//! A boot storm: N simulated machines, started at once, each doing what a BIOS machine's
//! firmware and iPXE do: DHCP with PXE options (DISCOVER/OFFER/REQUEST/ACK, arch 0), TFTP of
//! the boot file it was given (lock-step, blksize 1468, as PXE ROMs ask), DHCP again as iPXE
//! (user class `iPXE`), then HTTP of the script URL it was given and of the kernel and initrd
//! the script names. DHCP goes through one relay socket (giaddr = our address), as from a
//! rack behind a relay, so thousands of machines need no interfaces of their own.
//!
//! `--tftp-only FILE` fetches just FILE over TFTP from every machine (the TFTP-alone case).
//! Prints one line per run: `storm <label> clients=N ok=K p50_s=… p99_s=… total_s=…`, and
//! the first errors on stderr.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use clap::Parser;
use dhcproto::v4::{Architecture, DhcpOption, Flags, Message, MessageType, Opcode, OptionCode};
use dhcproto::{Decodable, Decoder, Encodable};
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use tokio::net::{TcpStream, UdpSocket};
use tokio::sync::{Barrier, mpsc};

#[derive(Parser)]
struct Args {
    /// Label of the server under test, printed on the result line.
    #[arg(long)]
    label: String,
    #[arg(long, default_value_t = 1000)]
    clients: usize,
    /// Our address: the relay's giaddr and the source of TFTP and HTTP.
    #[arg(long)]
    relay: Ipv4Addr,
    /// The DHCP server (and, with --tftp-only, the TFTP server).
    #[arg(long)]
    server: Ipv4Addr,
    /// Only TFTP this file from --server (no DHCP, no HTTP).
    #[arg(long)]
    tftp_only: Option<String>,
    /// Seconds before a machine gives up.
    #[arg(long, default_value_t = 120)]
    timeout: u64,
    /// The first byte pair of the simulated MACs (52:54:<a>:<b>:…), so runs don't collide.
    #[arg(long, default_value_t = 0)]
    mac_prefix: u8,
}

/// DHCP replies by transaction ID, to the machine waiting for them.
type Waiting = Arc<Mutex<HashMap<u32, mpsc::UnboundedSender<Message>>>>;

struct Dhcp {
    sock: UdpSocket,
    server: SocketAddr,
    relay: Ipv4Addr,
    waiting: Waiting,
}

impl Dhcp {
    /// Sends `msg` and waits for a reply with its xid of one of the `wanted` types (others,
    /// such as a late answer to a retransmission, are dropped as firmware drops them),
    /// sending again every 2 s (as PXE ROMs retry), at most 8 times.
    async fn exchange(&self, msg: &Message, wanted: &[MessageType]) -> Result<Message> {
        let bytes = msg.to_vec().context("encoding a DHCP message")?;
        let (tx, mut rx) = mpsc::unbounded_channel();
        self.waiting.lock().unwrap().insert(msg.xid(), tx);
        let answer = async {
            for _ in 0..8 {
                self.sock.send_to(&bytes, self.server).await?;
                let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
                while let Ok(Some(m)) = tokio::time::timeout_at(deadline, rx.recv()).await {
                    if msg_type(&m).is_some_and(|t| wanted.contains(&t)) {
                        return Ok(m);
                    }
                }
            }
            bail!("no DHCP answer to xid {:#x}", msg.xid())
        }
        .await;
        self.waiting.lock().unwrap().remove(&msg.xid());
        answer
    }

    fn request(&self, mac: &[u8; 6], xid: u32, ipxe: bool) -> Message {
        let mut m = Message::default();
        m.set_opcode(Opcode::BootRequest)
            .set_xid(xid)
            .set_hops(1)
            .set_flags(Flags::default())
            .set_chaddr(mac)
            .set_giaddr(self.relay);
        let o = m.opts_mut();
        o.insert(DhcpOption::ClientSystemArchitecture(Architecture::from(
            0u16,
        )));
        o.insert(DhcpOption::ClassIdentifier(
            b"PXEClient:Arch:00000:UNDI:002001".to_vec(),
        ));
        o.insert(DhcpOption::ParameterRequestList(vec![
            OptionCode::SubnetMask,
            OptionCode::Router,
            OptionCode::DomainNameServer,
            OptionCode::TFTPServerName,
            OptionCode::BootfileName,
        ]));
        if ipxe {
            o.insert(DhcpOption::UserClass(b"iPXE".to_vec()));
        }
        m
    }

    /// DISCOVER → OFFER → REQUEST → ACK; the ACK. A NAK starts again from DISCOVER with a
    /// new xid, as firmware does (a server that does not hold its offers may offer one
    /// address twice).
    async fn dora(&self, mac: &[u8; 6], xid: u32, ipxe: bool) -> Result<Message> {
        for attempt in 0..4u32 {
            let xid = xid | attempt << 1;
            let mut d = self.request(mac, xid, ipxe);
            d.opts_mut()
                .insert(DhcpOption::MessageType(MessageType::Discover));
            let offer = self.exchange(&d, &[MessageType::Offer]).await?;
            let server_id = match offer.opts().get(OptionCode::ServerIdentifier) {
                Some(DhcpOption::ServerIdentifier(s)) => *s,
                _ => bail!("OFFER without a server identifier"),
            };
            let mut r = self.request(mac, xid, ipxe);
            r.opts_mut()
                .insert(DhcpOption::MessageType(MessageType::Request));
            r.opts_mut()
                .insert(DhcpOption::RequestedIpAddress(offer.yiaddr()));
            r.opts_mut().insert(DhcpOption::ServerIdentifier(server_id));
            let ack = self
                .exchange(&r, &[MessageType::Ack, MessageType::Nak])
                .await?;
            if msg_type(&ack) == Some(MessageType::Ack) {
                return Ok(ack);
            }
        }
        bail!("NAKed four times")
    }
}

fn msg_type(m: &Message) -> Option<MessageType> {
    match m.opts().get(OptionCode::MessageType) {
        Some(DhcpOption::MessageType(t)) => Some(*t),
        _ => None,
    }
}

/// The boot file of an answer: option 67, else the `file` field.
fn boot_file(m: &Message) -> Result<String> {
    if let Some(DhcpOption::BootfileName(f)) = m.opts().get(OptionCode::BootfileName) {
        return Ok(String::from_utf8_lossy(f)
            .trim_end_matches('\0')
            .to_string());
    }
    let f = m
        .fname()
        .map(|f| {
            String::from_utf8_lossy(f)
                .trim_end_matches('\0')
                .to_string()
        })
        .unwrap_or_default();
    if f.is_empty() {
        bail!("the answer names no boot file");
    }
    Ok(f)
}

/// A lock-step TFTP read with blksize 1468 and tsize; returns the bytes received.
async fn tftp_get(local: Ipv4Addr, server: Ipv4Addr, file: &str) -> Result<u64> {
    let sock = UdpSocket::bind((local, 0)).await?;
    let mut rrq = vec![0, 1];
    for f in [file, "octet", "tsize", "0", "blksize", "1468"] {
        rrq.extend_from_slice(f.as_bytes());
        rrq.push(0);
    }
    let mut buf = vec![0u8; 1600];
    let mut peer: Option<SocketAddr> = None;
    let mut last: Vec<u8> = rrq.clone();
    let mut expect: u16 = 1;
    let mut got: u64 = 0;
    let mut block = 512usize;
    let mut tsize: Option<u64> = None;
    sock.send_to(&rrq, (server, 69)).await?;
    let mut tries = 0;
    loop {
        let r = tokio::time::timeout(Duration::from_secs(3), sock.recv_from(&mut buf)).await;
        let (n, from) = match r {
            Ok(r) => r?,
            Err(_) => {
                tries += 1;
                if tries > 5 {
                    bail!("TFTP {file}: timed out");
                }
                sock.send_to(&last, peer.unwrap_or((server, 69).into()))
                    .await?;
                continue;
            }
        };
        tries = 0;
        if n < 4 {
            continue;
        }
        peer.get_or_insert(from);
        let op = u16::from_be_bytes([buf[0], buf[1]]);
        let num = u16::from_be_bytes([buf[2], buf[3]]);
        match op {
            // OACK: the granted blksize and the file's size; a duplicate after data started
            // is ignored (answering it with ACK 0 would stall the transfer).
            6 if expect == 1 => {
                let opts: Vec<&[u8]> = buf[2..n].split(|b| *b == 0).collect();
                for kv in opts.chunks(2) {
                    if kv.len() == 2 && kv[0].eq_ignore_ascii_case(b"blksize") {
                        block = std::str::from_utf8(kv[1])?.parse()?;
                    }
                    if kv.len() == 2 && kv[0].eq_ignore_ascii_case(b"tsize") {
                        tsize = Some(std::str::from_utf8(kv[1])?.parse()?);
                    }
                }
                last = vec![0, 4, 0, 0];
            }
            6 => continue,
            3 if num == expect => {
                let len = n - 4;
                got += u64::try_from(len)?;
                last = vec![0, 4, buf[2], buf[3]];
                expect = expect.wrapping_add(1);
                if len < block {
                    sock.send_to(&last, from).await?;
                    if tsize.is_some_and(|t| t != got) {
                        bail!("TFTP {file}: {got} bytes received, the server said {tsize:?}");
                    }
                    return Ok(got);
                }
            }
            3 => {} // a duplicate: ACK it again below
            5 => bail!(
                "TFTP {file}: error {num}: {}",
                String::from_utf8_lossy(&buf[4..n]).trim_end_matches('\0')
            ),
            _ => continue,
        }
        sock.send_to(&last, from).await?;
    }
}

/// GET `url` (`http://<address>:<port>/<path>`) on a new connection, as iPXE does. `keep`: return the
/// body (the script); otherwise only count it (a thousand kernels are not kept in memory),
/// and check the count against Content-Length.
async fn http_get(url: &str, keep: bool) -> Result<Bytes> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| anyhow!("not an http URL: {url}"))?;
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let addr: SocketAddr = if host.contains(':') {
        host.parse()?
    } else {
        format!("{host}:80").parse()?
    };
    let stream = TcpStream::connect(addr).await?;
    let (mut send, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let req = hyper::Request::get(format!("/{path}"))
        .header(hyper::header::HOST, host)
        .body(Empty::<Bytes>::new())?;
    let resp = send.send_request(req).await?;
    if !resp.status().is_success() {
        bail!("GET {url}: {}", resp.status());
    }
    let length: Option<u64> = resp
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse().ok());
    let mut body = resp.into_body();
    if keep {
        return Ok(body.collect().await?.to_bytes());
    }
    let mut got = 0u64;
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame?.into_data() {
            got += u64::try_from(data.len())?;
        }
    }
    if length.is_some_and(|l| l != got) {
        bail!("GET {url}: {got} bytes, Content-Length said {length:?}");
    }
    Ok(Bytes::new())
}

/// The kernel and initrd URLs of an iPXE script.
fn script_urls(script: &str) -> Result<(String, String)> {
    let url_on = |cmd: &str| {
        script
            .lines()
            .find(|l| l.split_whitespace().next() == Some(cmd))
            .and_then(|l| l.split_whitespace().find(|w| w.starts_with("http://")))
            .map(String::from)
    };
    match (url_on("kernel"), url_on("initrd")) {
        (Some(k), Some(i)) => Ok((k, i)),
        _ => bail!("the script names no kernel and initrd: {script}"),
    }
}

/// One machine's boot; the address its (last) ACK gave it, if it did DHCP.
async fn machine(i: usize, args: Arc<Args>, dhcp: Arc<Dhcp>) -> Result<Option<Ipv4Addr>> {
    let idx = u16::try_from(i)?.to_be_bytes();
    let mac = [0x52, 0x54, args.mac_prefix, 0x5c, idx[0], idx[1]];
    if let Some(file) = &args.tftp_only {
        tftp_get(args.relay, args.server, file).await?;
        return Ok(None);
    }
    // xid: the machine in bits 4–27, the DORA attempt in bits 1–2, iPXE's DHCP in bit 0.
    let xid = 0x5000_0000 | u32::try_from(i)? << 4;
    let ack = dhcp.dora(&mac, xid, false).await?;
    let file = boot_file(&ack)?;
    let tftp_server = match ack.siaddr() {
        a if a.is_unspecified() => args.server,
        a => a,
    };
    tftp_get(args.relay, tftp_server, &file).await?;
    // iPXE asks again, and is given its script.
    let ack = dhcp.dora(&mac, xid | 1, true).await?;
    let url = boot_file(&ack)?;
    let script = http_get(&url, true).await?;
    let (kernel, initrd) = script_urls(&String::from_utf8_lossy(&script))?;
    for u in [kernel, initrd] {
        http_get(&u, false).await?;
    }
    Ok(Some(ack.yiaddr()))
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (p * (sorted.len() as f64 - 1.0)).round();
    sorted[(rank as usize).min(sorted.len() - 1)]
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Arc::new(Args::parse());
    let sock = UdpSocket::bind((args.relay, 67))
        .await
        .context("binding the relay socket (port 67)")?;
    let dhcp = Arc::new(Dhcp {
        sock,
        server: SocketAddr::new(args.server.into(), 67),
        relay: args.relay,
        waiting: Arc::default(),
    });
    // The relay's receiver: every answer goes to the machine whose xid it carries.
    let d = dhcp.clone();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 1500];
        while let Ok((n, _)) = d.sock.recv_from(&mut buf).await {
            if let Ok(m) = Message::decode(&mut Decoder::new(&buf[..n]))
                && let Some(tx) = d.waiting.lock().unwrap().get(&m.xid())
            {
                let _ = tx.send(m);
            }
        }
    });
    let barrier = Arc::new(Barrier::new(args.clients + 1));
    let mut tasks = Vec::new();
    for i in 0..args.clients {
        let (args, dhcp, barrier) = (args.clone(), dhcp.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let t0 = Instant::now();
            let r = tokio::time::timeout(
                Duration::from_secs(args.timeout),
                machine(i, args.clone(), dhcp),
            )
            .await
            .unwrap_or_else(|_| Err(anyhow!("machine {i}: timed out")));
            (r, t0.elapsed().as_secs_f64())
        }));
    }
    barrier.wait().await;
    let t0 = Instant::now();
    let mut times = Vec::new();
    let mut errors = Vec::new();
    let mut addresses = std::collections::HashSet::new();
    let mut duplicates = 0;
    for t in tasks {
        match t.await? {
            (Ok(addr), secs) => {
                times.push(secs);
                if let Some(a) = addr
                    && !addresses.insert(a)
                {
                    duplicates += 1;
                    errors.push(anyhow!("{a} was given to two machines"));
                }
            }
            (Err(e), _) => errors.push(e),
        }
    }
    let total = t0.elapsed().as_secs_f64();
    times.sort_by(f64::total_cmp);
    for e in errors.iter().take(5) {
        eprintln!("storm {}: {e:#}", args.label);
    }
    println!(
        "storm {} clients={} ok={} p50_s={:.3} p99_s={:.3} total_s={:.3} duplicate_addresses={duplicates}",
        args.label,
        args.clients,
        times.len() - duplicates,
        percentile(&times, 0.5),
        percentile(&times, 0.99),
        total
    );
    if !errors.is_empty() {
        std::process::exit(1);
    }
    Ok(())
}
