//! Reading a running daemon's JSON API, for `backlogd top` and `doctor`: plain HTTP, or
//! HTTPS and basic auth when the daemon's web config turns them on.

use std::{path::PathBuf, sync::Arc, time::Duration};

use anyhow::{Context as _, anyhow, bail};
use base64::Engine as _;
use clap::Args;
use ureq::tls::{PemItem, RootCerts, TlsConfig, TlsProvider};

use crate::api::Snapshot;

/// CA bundles of the common distributions, tried in order when no `--ca-file` is given.
const SYSTEM_CA_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
];

/// How to reach the daemon (shared by `top` and `doctor`).
#[derive(Debug, Clone, Args)]
pub struct ApiArgs {
    /// The daemon's HTTP endpoint: HOST:PORT, or a URL (`https://HOST:PORT` when its web
    /// config turns TLS on).
    #[arg(long, value_name = "HOST:PORT|URL", default_value = "127.0.0.1:9851")]
    pub api: String,
    /// Basic-auth user, when the daemon's web config has `basic_auth_users`.
    #[arg(long, value_name = "NAME", requires = "password_file")]
    pub user: Option<String>,
    /// File whose first line is that user's password (kept out of the command line and
    /// the process list).
    #[arg(long, value_name = "FILE", requires = "user")]
    pub password_file: Option<PathBuf>,
    /// PEM file of the CA that signed the daemon's HTTPS certificate [default: the
    /// system's CA bundle]. (A self-signed server certificate is refused, as browsers do:
    /// sign it with a private CA and pass that CA here.)
    #[arg(long, value_name = "FILE")]
    pub ca_file: Option<PathBuf>,
}

impl ApiArgs {
    /// A plain-HTTP endpoint without auth (an in-process daemon).
    pub fn plain(addr: std::net::SocketAddr) -> Self {
        Self {
            api: addr.to_string(),
            user: None,
            password_file: None,
            ca_file: None,
        }
    }
}

/// A configured client for one daemon.
pub struct Api {
    base: String,
    authorization: Option<String>,
    agent: ureq::Agent,
}

impl Api {
    pub fn new(args: &ApiArgs) -> anyhow::Result<Self> {
        let base = if args.api.contains("://") {
            args.api.trim_end_matches('/').to_owned()
        } else {
            format!("http://{}", args.api)
        };
        let https = match base.split_once("://") {
            Some(("http", _)) => false,
            Some(("https", _)) => true,
            _ => bail!(
                "--api {}: not HOST:PORT or an http:// or https:// URL. Fix: e.g. \
                 `--api 127.0.0.1:9851` or `--api https://localhost:9851`",
                args.api
            ),
        };
        let authorization = match (&args.user, &args.password_file) {
            (Some(user), Some(file)) => {
                let text = std::fs::read_to_string(file).with_context(|| {
                    format!(
                        "reading the password file {} (--password-file)",
                        file.display()
                    )
                })?;
                let password = text.lines().next().unwrap_or_default();
                let token =
                    base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
                Some(format!("Basic {token}"))
            }
            _ => None,
        };
        let mut config = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(10)))
            .http_status_as_error(false);
        if https {
            config = config.tls_config(tls_config(args.ca_file.as_ref())?);
        }
        Ok(Self {
            base,
            authorization,
            agent: config.build().into(),
        })
    }

    /// The daemon's `/api/v1/snapshot`.
    pub fn snapshot(&self) -> anyhow::Result<Snapshot> {
        let body = self.get("/api/v1/snapshot")?;
        serde_json::from_str(&body).with_context(|| {
            format!(
                "{}/api/v1/snapshot did not answer with a backlogd snapshot (a different \
                 backlogd version?)",
                self.base
            )
        })
    }

    fn get(&self, path: &str) -> anyhow::Result<String> {
        let url = format!("{}{path}", self.base);
        let mut request = self.agent.get(&url);
        if let Some(auth) = &self.authorization {
            request = request.header("Authorization", auth);
        }
        let mut response = request.call().map_err(|e| {
            anyhow!(
                "no backlogd daemon answers at {} ({e}). Fix: start it (`sudo backlogd run` or \
                 its systemd service), or point `--api` at the address it serves (an \
                 https:// URL if its web config turns TLS on, with --ca-file naming the CA \
                 that signed its certificate if that is not in the system's bundle)",
                self.base
            )
        })?;
        let status = response.status();
        if status == 401 {
            bail!(
                "{url}: 401 unauthorized: {}. Fix: pass --user and --password-file with a user \
                 of the daemon's web config (basic_auth_users)",
                if self.authorization.is_some() {
                    "the daemon refused this user and password"
                } else {
                    "the daemon requires basic auth"
                }
            );
        }
        if !status.is_success() {
            bail!("{url}: HTTP {status}");
        }
        response
            .body_mut()
            .read_to_string()
            .with_context(|| format!("reading {url}"))
    }
}

fn tls_config(ca_file: Option<&PathBuf>) -> anyhow::Result<TlsConfig> {
    let (path, named) = match ca_file {
        Some(p) => (p.clone(), true),
        None => match SYSTEM_CA_BUNDLES
            .iter()
            .map(PathBuf::from)
            .find(|p| p.exists())
        {
            Some(p) => (p, false),
            None => bail!(
                "https needs CA certificates to verify the daemon, and none of {} exists. \
                 Fix: pass --ca-file with the CA that signed the daemon's certificate",
                SYSTEM_CA_BUNDLES.join(", ")
            ),
        },
    };
    let pem = std::fs::read(&path).with_context(|| {
        format!(
            "reading the CA file {}{}",
            path.display(),
            if named { " (--ca-file)" } else { "" }
        )
    })?;
    let certs: Vec<_> = ureq::tls::parse_pem(&pem)
        .filter_map(|item| match item {
            Ok(PemItem::Certificate(c)) => Some(c.to_owned()),
            _ => None,
        })
        .collect();
    if certs.is_empty() {
        bail!(
            "{}: no PEM certificate in it. Fix: pass --ca-file with a PEM certificate \
             (-----BEGIN CERTIFICATE-----)",
            path.display()
        );
    }
    Ok(TlsConfig::builder()
        .provider(TlsProvider::Rustls)
        .root_certs(RootCerts::Specific(Arc::new(certs)))
        .unversioned_rustls_crypto_provider(Arc::new(
            tokio_rustls::rustls::crypto::ring::default_provider(),
        ))
        .build())
}
