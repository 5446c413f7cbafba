//! subd's RPC over HTTP (`POST /rpc/Subd.*`, JSON bodies, errors in the
//! `{"error": {"message"}}` envelope). Calls run on tokio's blocking pool with one ureq
//! agent; the herd's slots bound how many run at once.

use std::time::Duration;

use async_trait::async_trait;
use paddock_image::{ObjectId, UpdateRequest};
use paddock_subd::service::{
    CleanupReply, CleanupRequest, FetchReply, FetchRequest, PollRequest, PollResponse, UpdateReport,
};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::herd::{RpcError, SubRpc};

/// The header subd's client lock names its caller by.
const CLIENT_HEADER: &str = "x-paddock-client";

#[derive(Clone)]
pub struct HttpSubRpc {
    agent: ureq::Agent,
    /// How this controller names itself to subd's client lock.
    client: String,
}

impl HttpSubRpc {
    /// `timeout` bounds connecting; each call has its own bound ([`call_timeout`]).
    pub fn new(client: &str, timeout: Duration) -> Self {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(timeout))
            .build()
            .into();
        HttpSubRpc {
            agent,
            client: client.to_string(),
        }
    }

    async fn call<B, T>(&self, address: &str, method: &str, body: B) -> Result<T, RpcError>
    where
        B: Serialize + Send + 'static,
        T: DeserializeOwned + Send + 'static,
    {
        let url = subd_url(address, method);
        let agent = self.agent.clone();
        let client = self.client.clone();
        let method = method.to_string();
        tokio::task::spawn_blocking(move || {
            let resp = agent
                .post(&url)
                .config()
                .timeout_global(Some(call_timeout(&method)))
                .build()
                .header(CLIENT_HEADER, &client)
                .send_json(&body)
                .map_err(|e| RpcError(format!("Subd.{method} at {url}: {e}")))?;
            let status = resp.status().as_u16();
            let mut body = resp.into_body();
            let bytes = body
                .with_config()
                .limit(1 << 30)
                .read_to_vec()
                .map_err(|e| {
                    RpcError(format!("Subd.{method} at {url}: reading the answer: {e}"))
                })?;
            if status != 200 {
                return Err(RpcError(format!(
                    "Subd.{method}: {status}: {}",
                    paddock_wire::error_message(&bytes)
                )));
            }
            serde_json::from_slice(&bytes)
                .map_err(|e| RpcError(format!("Subd.{method}: a bad answer: {e}")))
        })
        .await
        .map_err(|e| RpcError(format!("Subd call: {e}")))?
    }
}

/// How long one call may take in all: a poll answers at once (its tree is the largest
/// answer), a cleanup removes files, a fetch is throttled to a share of the sub's link and
/// an update waits for its triggers.
pub fn call_timeout(method: &str) -> Duration {
    match method {
        "Poll" => Duration::from_secs(60),
        "Cleanup" => Duration::from_secs(300),
        _ => Duration::from_secs(3600),
    }
}

/// `host:port` or a URL → the URL of `Subd.<method>`.
pub fn subd_url(address: &str, method: &str) -> String {
    let a = address.trim().trim_end_matches('/');
    if a.contains("://") {
        format!("{a}/rpc/Subd.{method}")
    } else {
        format!("http://{a}/rpc/Subd.{method}")
    }
}

#[async_trait]
impl SubRpc for HttpSubRpc {
    async fn poll(&self, address: &str, req: PollRequest) -> Result<PollResponse, RpcError> {
        self.call(address, "Poll", req).await
    }

    async fn fetch(&self, address: &str, req: FetchRequest) -> Result<(), RpcError> {
        self.call::<_, FetchReply>(address, "Fetch", req)
            .await
            .map(drop)
    }

    async fn update(&self, address: &str, req: UpdateRequest) -> Result<(), RpcError> {
        self.call::<_, UpdateReport>(address, "Update", req)
            .await
            .map(drop)
    }

    async fn cleanup(&self, address: &str, objects: Vec<ObjectId>) -> Result<(), RpcError> {
        self.call::<_, CleanupReply>(address, "Cleanup", CleanupRequest { objects })
            .await
            .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(
            subd_url("198.18.0.9:6969", "Poll"),
            "http://198.18.0.9:6969/rpc/Subd.Poll"
        );
        assert_eq!(
            subd_url("https://m1:6969/", "Update"),
            "https://m1:6969/rpc/Subd.Update"
        );
    }
}
