//! TCP listeners of the current network namespace, via NETLINK_SOCK_DIAG.

use std::net::IpAddr;

use netlink_packet_core::{
    NLM_F_DUMP, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_sock_diag::{
    SockDiagMessage,
    constants::{AF_INET, AF_INET6, IPPROTO_TCP},
    inet::{ExtensionFlags, InetRequest, SocketId, StateFlags, nlas::Nla},
};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_SOCK_DIAG};

/// One listener as sock_diag reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiagListener {
    /// Filled in by the caller, who knows which namespace it asked.
    pub netns: u32,
    pub addr: IpAddr,
    pub port: u16,
    pub inode: u64,
    /// Connections waiting in the accept queue (`sk_ack_backlog`).
    pub accept_queue: u32,
    /// Accept-queue capacity (`sk_max_ack_backlog`).
    pub granted: u32,
    /// `sk_drops`.
    pub drops: Option<u32>,
}

pub fn listeners() -> std::io::Result<Vec<DiagListener>> {
    let mut socket = Socket::new(NETLINK_SOCK_DIAG)?;
    socket.bind_auto()?;
    socket.connect(&SocketAddr::new(0, 0))?;
    let mut out = Vec::new();
    for family in [AF_INET, AF_INET6] {
        dump(&socket, family, &mut out)?;
    }
    Ok(out)
}

fn dump(socket: &Socket, family: u8, out: &mut Vec<DiagListener>) -> std::io::Result<()> {
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    let mut request = NetlinkMessage::new(
        header,
        SockDiagMessage::InetRequest(InetRequest {
            family,
            protocol: IPPROTO_TCP,
            extensions: ExtensionFlags::SKMEMINFO,
            states: StateFlags::LISTEN,
            socket_id: if family == AF_INET {
                SocketId::new_v4()
            } else {
                SocketId::new_v6()
            },
        })
        .into(),
    );
    request.finalize();
    let mut buf = vec![0; request.buffer_len()];
    request.serialize(&mut buf);
    socket.send(&buf, 0)?;

    let mut receive = vec![0u8; 64 * 1024];
    loop {
        receive.clear();
        let size = socket.recv(&mut receive, 0)?;
        let mut offset = 0;
        while offset < size {
            let message = NetlinkMessage::<SockDiagMessage>::deserialize(&receive[offset..size])
                .map_err(|e| std::io::Error::other(format!("sock_diag: {e}")))?;
            let length = message.header.length as usize;
            match message.payload {
                NetlinkPayload::InnerMessage(SockDiagMessage::InetResponse(r)) => {
                    let drops = r.nlas.iter().find_map(|nla| match nla {
                        Nla::MemInfo(m) => Some(m.drops),
                        _ => None,
                    });
                    out.push(DiagListener {
                        netns: 0,
                        addr: r.header.socket_id.source_address,
                        port: r.header.socket_id.source_port,
                        inode: u64::from(r.header.inode),
                        accept_queue: r.header.recv_queue,
                        granted: r.header.send_queue,
                        drops,
                    });
                }
                NetlinkPayload::Done(_) => return Ok(()),
                NetlinkPayload::Error(e) => {
                    return Err(std::io::Error::other(format!("sock_diag: {e:?}")));
                }
                _ => {}
            }
            if length == 0 {
                break;
            }
            offset += length;
        }
    }
}
