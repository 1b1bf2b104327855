use super::*;

/// The log capture the integration tests use too.
#[path = "../../../tests/common/lines.rs"]
mod lines;
use lines::Lines;

/// A certificate for `cn` (self-signed; nothing verifies it here) and its key, as PEM.
fn pair(cn: &str) -> (String, String) {
    let mut params = rcgen::CertificateParams::new(vec![cn.to_string()]).expect("params");
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, cn);
    let key = rcgen::KeyPair::generate().expect("key");
    let cert = params.self_signed(&key).expect("cert");
    (cert.pem(), key.serialize_pem())
}

/// What a step does to the files.
enum Change {
    Nothing,
    Write(&'static str, String),
    Remove(&'static str),
    /// Writes the file in place with the same length and modification time, as two writes
    /// within one clock tick can: a `stat` does not see it.
    SameStamp(&'static str, String),
}

/// What a step expects: the outcome (a failure by the words its reason contains) and the
/// subject of the certificate then served.
enum Want {
    Unchanged,
    Reloaded,
    /// The client CA alone, its subject holding these words.
    CaReloaded(&'static str),
    Failed(&'static [&'static str]),
    Recovered,
}

#[test]
fn files_are_taken_when_they_change_and_load_and_never_when_they_do_not() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = |name: &str| dir.path().join(name);
    // Written next to the file and renamed over it, as a Secret volume or an atomic copy do.
    // Each version ends with room to spare (PEM ignores what follows its last block), so
    // that one written in place over it at the same length (`SameStamp`) is never cut short:
    // certificates and keys differ in length by a few bytes.
    let write = |name: &str, text: &str| {
        let tmp = path(&format!(".{name}.tmp"));
        std::fs::write(&tmp, format!("{text}{}", "\n".repeat(64))).expect("write");
        std::fs::rename(&tmp, path(name)).expect("rename");
    };
    let (a_cert, a_key) = pair("brain-a");
    let (b_cert, b_key) = pair("brain-b");
    let (c_cert, c_key) = pair("brain-c");
    let (ca, _) = pair("client-ca");
    let (ca2, _) = pair("client-ca-2");
    write("cert.pem", &a_cert);
    write("key.pem", &a_key);
    write("ca.pem", &ca);
    let paths = Paths {
        cert: path("cert.pem"),
        key: path("key.pem"),
        ca: Some(path("ca.pem")),
    };
    let mut reloader = Reloader::start(paths).expect("valid files at start");

    let steps: Vec<(&str, Vec<Change>, Look, Want, &str)> = vec![
        (
            "unchanged",
            vec![Change::Nothing],
            Look::Stat,
            Want::Unchanged,
            "brain-a",
        ),
        (
            "unchanged, read",
            vec![Change::Nothing],
            Look::Read,
            Want::Unchanged,
            "brain-a",
        ),
        (
            "the same bytes written again",
            vec![
                Change::Write("cert.pem", a_cert.clone()),
                Change::Write("key.pem", a_key.clone()),
            ],
            Look::Stat,
            Want::Unchanged,
            "brain-a",
        ),
        (
            "renewed",
            vec![
                Change::Write("cert.pem", b_cert.clone()),
                Change::Write("key.pem", b_key.clone()),
            ],
            Look::Stat,
            Want::Reloaded,
            "brain-b",
        ),
        (
            "unparsable certificate",
            vec![Change::Write(
                "cert.pem",
                "-----BEGIN CERTIFICATE-----\nnot base64!\n".into(),
            )],
            Look::Stat,
            Want::Failed(&["cert.pem", "not PEM"]),
            "brain-b",
        ),
        (
            "the same failure is not tried again",
            vec![Change::Nothing],
            Look::Read,
            Want::Unchanged,
            "brain-b",
        ),
        (
            "a half-written certificate",
            vec![Change::Write(
                "cert.pem",
                c_cert[..c_cert.len() / 2].to_string(),
            )],
            Look::Stat,
            Want::Failed(&["cert.pem"]),
            "brain-b",
        ),
        (
            "a certificate and a key of different pairs (a copy half done)",
            vec![Change::Write("cert.pem", c_cert.clone())],
            Look::Stat,
            Want::Failed(&["key.pem", "cert.pem", "different pairs"]),
            "brain-b",
        ),
        (
            "an invalid key",
            vec![Change::Write("key.pem", "garbage".into())],
            Look::Stat,
            Want::Failed(&["key.pem", "no private key"]),
            "brain-b",
        ),
        (
            "the key missing for a moment",
            vec![Change::Remove("key.pem")],
            Look::Stat,
            Want::Failed(&["reading", "key.pem"]),
            "brain-b",
        ),
        (
            "fixed",
            vec![Change::Write("key.pem", c_key.clone())],
            Look::Stat,
            Want::Reloaded,
            "brain-c",
        ),
        (
            "a client CA without a certificate",
            vec![Change::Write("ca.pem", String::new())],
            Look::Stat,
            Want::Failed(&["ca.pem", "no CERTIFICATE"]),
            "brain-c",
        ),
        (
            "the bad copy undone",
            vec![Change::Write("ca.pem", ca.clone())],
            Look::Stat,
            Want::Recovered,
            "brain-c",
        ),
        (
            "the client CA renewed alone",
            vec![Change::Write("ca.pem", ca2.clone())],
            Look::Stat,
            Want::CaReloaded("client-ca-2"),
            "brain-c",
        ),
        (
            "a pair written in place within one clock tick: unseen by stat",
            vec![
                Change::SameStamp("cert.pem", b_cert.clone()),
                Change::SameStamp("key.pem", b_key.clone()),
            ],
            Look::Stat,
            Want::Unchanged,
            "brain-c",
        ),
        (
            "… and seen when read",
            vec![Change::Nothing],
            Look::Read,
            Want::Reloaded,
            "brain-b",
        ),
    ];
    for (what, changes, look, want, serving) in steps {
        for change in changes {
            match change {
                Change::Nothing => {}
                Change::Write(name, text) => write(name, &text),
                Change::Remove(name) => std::fs::remove_file(path(name)).expect("remove"),
                Change::SameStamp(name, text) => {
                    let file = path(name);
                    let meta = std::fs::metadata(&file).expect("stat");
                    let mut text = text.into_bytes();
                    // PEM ignores what follows its last block: pad or cut to the old length.
                    text.resize(usize::try_from(meta.len()).expect("len"), b'\n');
                    std::fs::write(&file, text).expect("write in place");
                    std::fs::File::options()
                        .write(true)
                        .open(&file)
                        .expect("open")
                        .set_modified(meta.modified().expect("mtime"))
                        .expect("set mtime");
                }
            }
        }
        let checked = reloader.check(look);
        match (&want, &checked) {
            (Want::Unchanged, Checked::Unchanged) | (Want::Recovered, Checked::Recovered) => {}
            (Want::Reloaded, Checked::Reloaded(reload)) => {
                let leaf = reload.certificate.as_ref().expect("the pair changed");
                assert!(leaf.subject.contains(serving), "{what}: {reload:?}");
                assert_eq!(reload.client_ca, None, "{what}");
            }
            (Want::CaReloaded(subject), Checked::Reloaded(reload)) => {
                assert_eq!(reload.certificate, None, "{what}: {reload:?}");
                let subjects = reload.client_ca.as_deref().expect("the CA changed");
                assert!(
                    subjects.iter().any(|s| s.contains(subject)),
                    "{what}: {reload:?}"
                );
            }
            (Want::Failed(words), Checked::Failed(reason)) => {
                for word in *words {
                    assert!(reason.contains(word), "{what}: {reason:?} lacks {word:?}");
                }
                assert_eq!(reloader.failure.as_ref(), Some(reason), "{what}");
            }
            _ => panic!("{what}: got {checked:?}"),
        }
        assert!(
            reloader.served.leaf.subject.contains(serving),
            "{what}: serving {:?}",
            reloader.served.leaf
        );
        if !matches!(want, Want::Failed(_)) && !matches!(checked, Checked::Unchanged) {
            assert_eq!(reloader.failure, None, "{what}");
        }
    }
}

#[test]
fn invalid_files_at_start_are_errors_naming_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = |name: &str| dir.path().join(name);
    let (a_cert, a_key) = pair("brain-a");
    let (b_cert, _) = pair("brain-b");
    std::fs::write(path("a.pem"), &a_cert).expect("write");
    std::fs::write(path("a-key.pem"), &a_key).expect("write");
    std::fs::write(path("b.pem"), &b_cert).expect("write");
    std::fs::write(path("junk"), "junk").expect("write");
    /// What, the certificate, key and CA files, and the words the error must hold.
    type Case<'a> = (&'a str, &'a str, &'a str, Option<&'a str>, &'a [&'a str]);
    let cases: &[Case] = &[
        (
            "missing cert",
            "none.pem",
            "a-key.pem",
            None,
            &["reading", "none.pem"],
        ),
        (
            "junk cert",
            "junk",
            "a-key.pem",
            None,
            &["junk", "no CERTIFICATE"],
        ),
        (
            "junk key",
            "a.pem",
            "junk",
            None,
            &["junk", "no private key"],
        ),
        (
            "other pair",
            "b.pem",
            "a-key.pem",
            None,
            &["b.pem", "a-key.pem"],
        ),
        (
            "missing CA",
            "a.pem",
            "a-key.pem",
            Some("none-ca.pem"),
            &["none-ca.pem"],
        ),
        (
            "junk CA",
            "a.pem",
            "a-key.pem",
            Some("junk"),
            &["junk", "no CERTIFICATE"],
        ),
    ];
    for (what, cert, key, ca, words) in cases {
        let paths = Paths {
            cert: path(cert),
            key: path(key),
            ca: ca.map(path),
        };
        let Err(e) = Reloader::start(paths) else {
            panic!("{what}: started");
        };
        for word in *words {
            assert!(e.to_string().contains(word), "{what}: {e} lacks {word:?}");
        }
    }
}

/// The log line of a reload names what changed: a client CA renewed alone is named as the
/// client CA (its file and subject), not as a new certificate with the served one's subject
/// (until 2026-12-06 every reload was logged as the certificate's); both changed, both.
#[test]
fn a_reload_logs_what_changed() {
    let lines = Lines::default();
    let _log = tracing::subscriber::set_default(lines.subscriber(tracing::Level::INFO));
    let last_line = || lines.last();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = |name: &str| dir.path().join(name);
    let write = |name: &str, text: &str| {
        let tmp = path(&format!(".{name}.tmp"));
        std::fs::write(&tmp, text).expect("write");
        std::fs::rename(&tmp, path(name)).expect("rename");
    };
    let (cert, key) = pair("brain-a");
    let (ca, _) = pair("client-ca-1");
    write("cert.pem", &cert);
    write("key.pem", &key);
    write("ca.pem", &ca);
    let paths = Paths {
        cert: path("cert.pem"),
        key: path("key.pem"),
        ca: Some(path("ca.pem")),
    };
    let tls = ServerTls::start(paths, &ApiMetrics::default()).expect("start");

    let (ca, _) = pair("client-ca-2");
    write("ca.pem", &ca);
    drop(tls.current());
    let line = last_line();
    assert!(
        line.contains("client CA reloaded")
            && line.contains("ca.pem")
            && line.contains("client-ca-2")
            && !line.contains("brain-a")
            && !line.contains("new certificate"),
        "{line}"
    );

    let (cert, key) = pair("brain-b");
    let (ca, _) = pair("client-ca-3");
    write("cert.pem", &cert);
    write("key.pem", &key);
    write("ca.pem", &ca);
    drop(tls.current());
    let line = last_line();
    assert!(
        line.contains("certificate and client CA reloaded")
            && line.contains("brain-b")
            && line.contains("client-ca-3"),
        "{line}"
    );
}

/// The certificate's notAfter in `kpng status`'s JSON has the milliseconds every other time
/// there has (docs/observability.md, "Output for scripts"): it had none.
#[test]
fn not_after_has_the_status_times_precision() {
    let leaf = Leaf {
        subject: "CN=brain".into(),
        not_after: 1_893_456_000,
    };
    assert_eq!(leaf.not_after_rfc3339(), "2030-01-01T00:00:00.000Z");
}
