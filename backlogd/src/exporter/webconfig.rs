//! TLS and basic auth from a web config file in the Prometheus exporter-toolkit format
//! (`--web.config.file` of node_exporter and friends), so one file serves every exporter
//! on a host:
//!
//! ```yaml
//! tls_server_config:
//!   cert_file: server.crt      # relative paths are relative to this file
//!   key_file: server.key
//!   min_version: TLS12         # optional: TLS12 or TLS13
//! basic_auth_users:
//!   prometheus: $2y$10$...     # bcrypt hash (htpasswd -nBC 10 "" | tr -d ':\n')
//! ```
//!
//! Like exporter-toolkit, unknown keys are errors. Its client-certificate, cipher and
//! HTTP/2 settings are not supported yet and are rejected by name rather than ignored.

use std::{
    collections::{BTreeMap, HashSet},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use serde::Deserialize;
use tokio_rustls::{
    TlsAcceptor,
    rustls::{
        self, ServerConfig,
        pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject as _},
    },
};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileFormat {
    tls_server_config: Option<TlsFormat>,
    basic_auth_users: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TlsFormat {
    cert_file: PathBuf,
    key_file: PathBuf,
    min_version: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum WebConfigError {
    #[error(
        "cannot read web config file {path}: {error}. Fix: create it, or correct \
         `http.web_config_file` / `--web-config-file`"
    )]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error(
        "web config file {path}: {message}. Fix: use the exporter-toolkit format with the \
         keys tls_server_config (cert_file, key_file, min_version) and basic_auth_users"
    )]
    Parse { path: PathBuf, message: String },
    #[error(
        "web config file {path}: basic_auth_users.{user} is not a bcrypt hash ({error}). \
         Fix: generate one, e.g. `htpasswd -nBC 10 \"\" | tr -d ':\\n'`"
    )]
    Hash {
        path: PathBuf,
        user: String,
        error: bcrypt::BcryptError,
    },
    #[error(
        "web config file {path}: basic_auth_users.{user} has bcrypt cost {cost}: one check \
         would take seconds of CPU (each cost step doubles it; 10 takes tens of ms), longer \
         than a scrape may wait. Fix: hash the password again with cost 10 to {WARN_COST}, \
         e.g. `htpasswd -nBC 10 \"\" | tr -d ':\\n'`"
    )]
    Cost {
        path: PathBuf,
        user: String,
        cost: u32,
    },
    #[error("web config file {path}: tls_server_config.{key} {file}: {why}. Fix: {fix}")]
    Tls {
        path: PathBuf,
        key: &'static str,
        file: PathBuf,
        why: String,
        fix: &'static str,
    },
}

/// What a web config file asks for, ready to use.
#[derive(Clone, Default)]
pub struct WebConfig {
    pub tls: Option<TlsAcceptor>,
    pub auth: Option<Arc<BasicAuth>>,
}

impl std::fmt::Debug for WebConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebConfig")
            .field("tls", &self.tls.is_some())
            .field("auth_users", &self.auth.as_ref().map(|a| a.users.len()))
            .finish()
    }
}

impl WebConfig {
    /// Reads and checks the file: YAML, bcrypt hashes, certificate and key.
    pub fn load(path: &Path) -> Result<Self, WebConfigError> {
        let text = std::fs::read_to_string(path).map_err(|error| WebConfigError::Read {
            path: path.to_owned(),
            error,
        })?;
        // An empty file is a valid exporter-toolkit config meaning "nothing".
        let file: FileFormat = if text.trim().is_empty() {
            FileFormat {
                tls_server_config: None,
                basic_auth_users: None,
            }
        } else {
            serde_yaml_ng::from_str(&text).map_err(|e| WebConfigError::Parse {
                path: path.to_owned(),
                message: e.to_string(),
            })?
        };
        let base = path.parent().unwrap_or(Path::new("."));
        let tls = file
            .tls_server_config
            .map(|t| tls_acceptor(path, base, t))
            .transpose()?;
        let auth = match file.basic_auth_users {
            Some(users) if !users.is_empty() => {
                for (user, hash) in &users {
                    let parts = hash.parse::<bcrypt::HashParts>().map_err(|error| {
                        WebConfigError::Hash {
                            path: path.to_owned(),
                            user: user.clone(),
                            error,
                        }
                    })?;
                    check_cost(path, user, parts.get_cost())?;
                }
                Some(Arc::new(BasicAuth::new(users)))
            }
            _ => None,
        };
        Ok(Self { tls, auth })
    }

    pub fn describe(&self) -> String {
        format!(
            "TLS {}, basic auth {}",
            if self.tls.is_some() { "on" } else { "off" },
            match &self.auth {
                Some(a) => format!("on ({} users)", a.users.len()),
                None => "off".into(),
            }
        )
    }
}

fn tls_acceptor(path: &Path, base: &Path, t: TlsFormat) -> Result<TlsAcceptor, WebConfigError> {
    let tls_err = |key, file: &Path, why: String, fix| WebConfigError::Tls {
        path: path.to_owned(),
        key,
        file: file.to_owned(),
        why,
        fix,
    };
    let cert_file = base.join(&t.cert_file);
    let key_file = base.join(&t.key_file);
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&cert_file)
        .and_then(|it| it.collect::<Result<_, _>>())
        .map_err(|e| {
            tls_err(
                "cert_file",
                &cert_file,
                e.to_string(),
                "name a readable PEM certificate (chain)",
            )
        })?;
    if certs.is_empty() {
        return Err(tls_err(
            "cert_file",
            &cert_file,
            "no certificate in it".into(),
            "name a PEM file with a CERTIFICATE block",
        ));
    }
    let key = PrivateKeyDer::from_pem_file(&key_file).map_err(|e| {
        tls_err(
            "key_file",
            &key_file,
            e.to_string(),
            "name a readable PEM private key (PKCS#8, PKCS#1 or SEC1)",
        )
    })?;
    let versions: &[&rustls::SupportedProtocolVersion] = match t.min_version.as_deref() {
        None | Some("TLS12") => &[&rustls::version::TLS13, &rustls::version::TLS12],
        Some("TLS13") => &[&rustls::version::TLS13],
        Some(other) => {
            return Err(WebConfigError::Parse {
                path: path.to_owned(),
                message: format!(
                    "tls_server_config.min_version `{other}` is not supported (TLS10 and TLS11 \
                     are insecure and not implemented); use TLS12 or TLS13"
                ),
            });
        }
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)
        .map_err(|e| {
            tls_err(
                "min_version",
                &cert_file,
                e.to_string(),
                "use TLS12 or TLS13",
            )
        })?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| {
            tls_err(
                "key_file",
                &key_file,
                format!("does not go with {}: {e}", cert_file.display()),
                "name the key the certificate was issued for",
            )
        })?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// bcrypt costs above this get a warning: every uncached check then takes over 200 ms.
const WARN_COST: u32 = 12;
/// ... and above this are refused: a check would take seconds (cost 10: 60 ms, cost 16:
/// 3.3 s with htpasswd on the CI machine).
const MAX_COST: u32 = 16;

fn check_cost(path: &Path, user: &str, cost: u32) -> Result<(), WebConfigError> {
    if cost > MAX_COST {
        return Err(WebConfigError::Cost {
            path: path.to_owned(),
            user: user.to_owned(),
            cost,
        });
    }
    if cost > WARN_COST {
        tracing::warn!(
            "web config file {}: basic_auth_users.{user} has bcrypt cost {cost}; every check \
             of a password not yet accepted costs {}x a cost-10 check on the one core \
             bcrypt checks share. Cost 10 to {WARN_COST} is enough for a scrape password",
            path.display(),
            1u32 << (cost - 10)
        );
    }
    Ok(())
}

/// Basic auth against bcrypt hashes. bcrypt is slow by design (tens of ms per check), so
/// checks run on the blocking pool one at a time, a check that would have to wait is
/// refused at once (401; Prometheus retries at its next scrape), and a successful pair is
/// remembered, as exporter-toolkit does: a flood of wrong passwords then costs one core at
/// most, holds no connection slot waiting, and a scraper whose credentials were already
/// accepted is answered without a check. Refused pairs are remembered too (as keyed
/// fingerprints, not the passwords): clients repeating a wrong password (a stale secret
/// in some config, a dumb flood) are answered without a check and stop taking the one
/// check slot from a scraper whose password has not been checked yet. A flood that tries
/// a new password every time still can; that is a brute-force attack, and the log and
/// the 401s show it.
pub struct BasicAuth {
    users: BTreeMap<String, String>,
    accepted: Mutex<HashSet<(String, String)>>,
    refused: Mutex<HashSet<u64>>,
    /// Keys the refused fingerprints: random per process and reload.
    fingerprint: std::hash::RandomState,
    checking: Arc<tokio::sync::Semaphore>,
}

/// Remembered successes and refusals; past this many the memory is cleared (a cache).
const ACCEPTED_MAX: usize = 256;
const REFUSED_MAX: usize = 4096;

impl BasicAuth {
    fn new(users: BTreeMap<String, String>) -> Self {
        Self {
            users,
            accepted: Mutex::new(HashSet::new()),
            refused: Mutex::new(HashSet::new()),
            fingerprint: std::hash::RandomState::new(),
            checking: Arc::new(tokio::sync::Semaphore::new(1)),
        }
    }

    /// Whether an `Authorization` header value names a user with the right password.
    pub async fn allows(&self, header: Option<&[u8]>) -> bool {
        use base64::Engine as _;
        let Some(encoded) = header.and_then(|h| h.strip_prefix(b"Basic ")) else {
            return false;
        };
        let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(encoded.trim_ascii())
        else {
            return false;
        };
        let Ok(decoded) = String::from_utf8(decoded) else {
            return false;
        };
        let Some((user, password)) = decoded.split_once(':') else {
            return false;
        };
        let pair = (user.to_owned(), password.to_owned());
        if self
            .accepted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&pair)
        {
            return true;
        }
        let print = std::hash::BuildHasher::hash_one(&self.fingerprint, &pair);
        if self
            .refused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&print)
        {
            return false;
        }
        // An unknown user is checked against some real hash anyway, so that the time an
        // answer takes does not tell which user names exist.
        let (known, hash) = match self.users.get(user) {
            Some(h) => (true, h.clone()),
            None => match self.users.values().next() {
                Some(h) => (false, h.clone()),
                None => return false,
            },
        };
        // The permit moves into the check: a client that hangs up does not free the slot
        // while its bcrypt still runs.
        let Ok(slot) = self.checking.clone().try_acquire_owned() else {
            return false;
        };
        let password = pair.1.clone();
        let verdict = tokio::task::spawn_blocking(move || {
            let _slot = slot;
            bcrypt::verify(password, &hash)
        })
        .await
        .ok()
        .and_then(Result::ok);
        let ok = verdict == Some(true) && known;
        if ok {
            let mut accepted = self.accepted.lock().unwrap_or_else(|e| e.into_inner());
            if accepted.len() >= ACCEPTED_MAX {
                accepted.clear();
            }
            accepted.insert(pair);
        } else if verdict.is_some() {
            let mut refused = self.refused.lock().unwrap_or_else(|e| e.into_inner());
            if refused.len() >= REFUSED_MAX {
                refused.clear();
            }
            refused.insert(print);
        }
        ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(users: &str) -> Result<WebConfig, WebConfigError> {
        let dir = std::env::temp_dir().join(format!("backlogd-webconfig-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("web.yml");
        std::fs::write(&path, format!("basic_auth_users:\n{users}")).unwrap();
        let loaded = WebConfig::load(&path);
        std::fs::remove_dir_all(dir).ok();
        loaded
    }

    #[test]
    fn a_bcrypt_cost_of_seconds_per_check_is_refused_with_the_fix() {
        const SALT_AND_HASH: &str = "757Z651vHdpP9jYGLGAZSu8Hv7mmLSIU/DcQALzsURkOq10uCIWeC";
        assert!(load(&format!("  a: $2y$16${SALT_AND_HASH}\n")).is_ok());
        let err = load(&format!("  a: $2y$17${SALT_AND_HASH}\n"))
            .expect_err("cost 17 refused")
            .to_string();
        assert!(
            err.contains("basic_auth_users.a has bcrypt cost 17")
                && err.contains("htpasswd -nBC 10"),
            "{err}"
        );
    }
}
