//! The schema registry client (`spate_formats::registry`) against the
//! registry test fixture (`ci/registry_fixture.py`, the Confluent REST
//! subset; started here on a free port, one per test), plain and through a
//! TLS proxy. Needs `python3`; a missing one fails the test (never a skip).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use spate_formats::avro::{SchemaErrorKind, SchemaSource};
use spate_formats::protobuf::{ProtoSchemaSource, SchemaError};
use spate_formats::registry::{
    RegistryClient, RegistryConfig, RegistryError, RegistryRetry, SchemaReference, SchemaType,
};
use spate_http::{Credentials, TlsOptions, tls};

const AVRO: &str = r#"{"type":"record","name":"R","fields":[{"name":"a","type":"long"}]}"#;

/// One fixture process, killed on drop.
struct Fixture {
    child: Child,
    url: String,
}

impl Fixture {
    fn start(user: Option<&str>) -> Fixture {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../ci/registry_fixture.py");
        let mut cmd = Command::new("python3");
        cmd.arg(script).args(["--port", "0", "--exit-with-stdin"]);
        cmd.stdin(Stdio::piped());
        if let Some(u) = user {
            cmd.args(["--user", u]);
        }
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 runs ci/registry_fixture.py (the registry fixture needs python3)");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(line.starts_with("http://"), "fixture said {line:?}");
        Fixture {
            child,
            url: line.trim().to_owned(),
        }
    }

    /// A control request (`fail?status=503`, `recover`) or a GET of the
    /// fixture's request counter.
    fn control(&self, method: &str, what: &str) -> String {
        let out = Command::new("curl")
            .args([
                "-sS",
                "-f",
                "-X",
                method,
                &format!("{}/_fixture/{what}", self.url),
            ])
            .output()
            .expect("curl runs");
        assert!(out.status.success(), "control {what}: {out:?}");
        String::from_utf8(out.stdout).unwrap()
    }

    fn schema_gets(&self) -> u64 {
        let v: serde_json::Value = serde_json::from_str(&self.control("GET", "requests")).unwrap();
        v["schema_gets"].as_u64().unwrap()
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn quick(url: &str) -> RegistryConfig {
    let mut c = RegistryConfig::new(url);
    c.retry = RegistryRetry {
        attempts: 4,
        first_backoff: Duration::from_millis(50),
        max_backoff: Duration::from_millis(200),
    };
    c
}

#[test]
fn schemas_by_id_with_their_type_and_a_cache() {
    let f = Fixture::start(None);
    let c = RegistryClient::new(quick(&f.url)).unwrap();
    assert_eq!(c.check().unwrap(), Vec::<String>::new());
    let avro = c.register("t-value", SchemaType::Avro, AVRO, &[]).unwrap();
    let proto = c
        .register(
            "p-value",
            SchemaType::Protobuf,
            "syntax = \"proto3\"; message M {}",
            &[],
        )
        .unwrap();
    assert_ne!(avro, proto);
    // Registering again: the same id, no new version.
    assert_eq!(
        c.register("t-value", SchemaType::Avro, AVRO, &[]).unwrap(),
        avro
    );
    assert_eq!(c.versions("t-value").unwrap(), vec![1]);
    assert_eq!(c.versions("nope").unwrap(), Vec::<i64>::new());

    let s = c.get(avro).unwrap();
    assert_eq!(
        (s.id, s.schema_type, s.schema.as_str()),
        (avro, SchemaType::Avro, AVRO)
    );
    let p = c.get(proto).unwrap();
    assert_eq!(p.schema_type, SchemaType::Protobuf);
    assert!(p.schema.contains("message M"), "{p:?}");
    let asked = f.schema_gets();
    assert_eq!(asked, 2);
    // Cached: no further request for either id.
    for _ in 0..10 {
        c.get(avro).unwrap();
        c.get(proto).unwrap();
    }
    assert_eq!(f.schema_gets(), asked);

    let latest = c.latest("t-value").unwrap().expect("the subject exists");
    assert_eq!((latest.version, latest.schema.id), (1, avro));
    assert!(c.latest("nope").unwrap().is_none());
    assert_eq!(
        c.check().unwrap(),
        vec!["p-value".to_owned(), "t-value".to_owned()]
    );
}

#[test]
fn an_unknown_id_is_an_error_naming_it_and_asked_once() {
    let f = Fixture::start(None);
    let c = RegistryClient::new(quick(&f.url)).unwrap();
    let e = c.get(4711).unwrap_err();
    assert!(
        matches!(e, RegistryError::UnknownId { id: 4711, .. }),
        "{e}"
    );
    let text = e.record_error().to_string();
    assert!(text.contains("schema id 4711"), "{text}");
    assert!(text.contains(&f.url), "{text}");
    assert!(text.contains("40403"), "{text}");
    // Not retried, and remembered: a run of such messages costs one request.
    assert_eq!(f.schema_gets(), 1);
    assert_eq!(c.get(4711).unwrap_err(), e);
    assert_eq!(f.schema_gets(), 1);
}

#[test]
fn basic_auth_is_sent_and_a_refusal_is_named() {
    let f = Fixture::start(Some("alice:s3cret"));
    let anonymous = RegistryClient::new(quick(&f.url)).unwrap();
    let e = anonymous.check().unwrap_err();
    match &e {
        RegistryError::Refused { status, .. } => assert_eq!(*status, 401),
        other => panic!("{other}"),
    }
    assert!(e.to_string().contains("user and password"), "{e}");
    let mut config = quick(&f.url);
    config.credentials = Some(Credentials {
        user: "alice".into(),
        password: "s3cret".into(),
    });
    let c = RegistryClient::new(config).unwrap();
    let id = c.register("t-value", SchemaType::Avro, AVRO, &[]).unwrap();
    assert_eq!(c.get(id).unwrap().schema, AVRO);
}

/// A registry that answers 503 is retried; one that recovers within the
/// retry bound gives the schema, one that does not is `Unavailable`
/// naming the id, the attempts and the last status.
#[test]
fn transient_failures_are_retried_up_to_the_bound() {
    let f = Fixture::start(None);
    let c = RegistryClient::new(quick(&f.url)).unwrap();
    let id = c.register("t-value", SchemaType::Avro, AVRO, &[]).unwrap();
    let other = c
        .register("u-value", SchemaType::Avro, r#"{"type":"string"}"#, &[])
        .unwrap();

    f.control("POST", "fail?status=503");
    let e = c.get(id).unwrap_err();
    match &e {
        RegistryError::Unavailable { attempts, last, .. } => {
            assert_eq!(*attempts, 4);
            assert!(last.contains("HTTP 503"), "{last}");
        }
        other => panic!("{other}"),
    }
    assert_eq!(e.schema_id(), Some(id));
    assert!(
        e.record_error()
            .to_string()
            .contains(&format!("schema id {id}")),
        "{e}"
    );

    // Recovers while the client is backing off (50+100+200 ms of waits).
    f.control("POST", "fail?status=500");
    let started = std::time::Instant::now();
    let recover = std::thread::spawn({
        let url = f.url.clone();
        move || {
            std::thread::sleep(Duration::from_millis(120));
            let out = Command::new("curl")
                .args([
                    "-sS",
                    "-f",
                    "-X",
                    "POST",
                    &format!("{url}/_fixture/recover"),
                ])
                .output()
                .unwrap();
            assert!(out.status.success());
        }
    });
    let s = c.get(other).unwrap();
    recover.join().unwrap();
    assert_eq!(s.schema, r#"{"type":"string"}"#);
    assert!(started.elapsed() >= Duration::from_millis(100));
}

/// The TLS setup is the ClickHouse writer's: a CA file is trusted, the
/// system roots alone refuse the test certificate (no schema comes back).
#[test]
fn https_with_a_ca_file() {
    let f = Fixture::start(None);
    let proxy = TlsProxy::start(&f.url);
    let mut config = quick(&proxy.url);
    config.retry.attempts = 1;
    let untrusting = RegistryClient::new(config.clone()).unwrap();
    let e = untrusting.check().unwrap_err();
    assert!(e.is_transient(), "{e}");
    assert!(e.to_string().contains("certificate"), "{e}");

    config.tls = Some(
        tls::client_config(&TlsOptions {
            ca_file: Some(proxy.ca_file.clone()),
            insecure: false,
        })
        .unwrap(),
    );
    let c = RegistryClient::new(config).unwrap();
    let id = c.register("t-value", SchemaType::Avro, AVRO, &[]).unwrap();
    assert_eq!(c.get(id).unwrap().schema, AVRO);
}

/// A TLS-terminating proxy (rustls, a certificate made here for
/// 127.0.0.1) in front of the plain fixture, on its own runtime thread.
struct TlsProxy {
    url: String,
    ca_file: std::path::PathBuf,
    _rt: tokio::runtime::Runtime,
}

impl TlsProxy {
    fn start(upstream: &str) -> TlsProxy {
        use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
        let upstream = upstream.trim_start_matches("http://").to_owned();
        let rcgen::CertifiedKey { cert, signing_key } =
            rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()])
                .unwrap();
        let dir = std::env::temp_dir().join(format!(
            "spate-registry-tls-{}-{}",
            std::process::id(),
            upstream.replace([':', '.'], "_")
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let ca_file = dir.join("ca.pem");
        std::fs::write(&ca_file, cert.pem()).unwrap();
        let server = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(signing_key.serialize_der())),
        )
        .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let url = format!(
            "https://127.0.0.1:{}",
            listener.local_addr().unwrap().port()
        );
        rt.spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let acceptor = acceptor.clone();
                let upstream = upstream.clone();
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let mut plain = tokio::net::TcpStream::connect(&upstream).await.unwrap();
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                });
            }
        });
        TlsProxy {
            url,
            ca_file,
            _rt: rt,
        }
    }
}

impl Drop for TlsProxy {
    fn drop(&mut self) {
        if let Some(dir) = self.ca_file.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Protobuf schemas by id, as `crate::protobuf` asks for them: the
/// `.proto` text compiled with the files its references name (fetched by
/// subject and version); an Avro id or an unknown one is an error naming it.
#[test]
fn protobuf_descriptors_with_references() {
    let f = Fixture::start(None);
    let c = RegistryClient::new(quick(&f.url)).unwrap();
    let common = "syntax = \"proto3\";\npackage c;\nmessage Unit { string name = 1; }\n";
    c.register("common.proto", SchemaType::Protobuf, common, &[])
        .unwrap();
    let main = "syntax = \"proto3\";\npackage m;\nimport \"common.proto\";\n\
                message Reading { int64 at = 1; c.Unit unit = 2; double value = 3; }\n";
    let id = c
        .register(
            "readings-value",
            SchemaType::Protobuf,
            main,
            &[SchemaReference {
                name: "common.proto".into(),
                subject: "common.proto".into(),
                version: 1,
            }],
        )
        .unwrap();
    let file = c.descriptor(id).unwrap();
    let names: Vec<String> = file.messages().map(|m| m.full_name().to_owned()).collect();
    assert_eq!(names, vec!["m.Reading".to_owned()]);
    let unit = file
        .messages()
        .next()
        .unwrap()
        .get_field_by_name("unit")
        .unwrap();
    assert_eq!(unit.kind().as_message().unwrap().full_name(), "c.Unit");

    let avro = c.register("t-value", SchemaType::Avro, AVRO, &[]).unwrap();
    let e = c.descriptor(avro).unwrap_err();
    assert!(
        matches!(e, SchemaError::Fetch { id, .. } if id == avro),
        "{e}"
    );
    assert!(e.to_string().contains("AVRO"), "{e}");
    let e = c.descriptor(999).unwrap_err().to_string();
    assert!(e.contains("schema id 999") && e.contains(&f.url), "{e}");

    // A reference the registry does not have.
    let dangling = c
        .register(
            "d-value",
            SchemaType::Protobuf,
            "syntax = \"proto3\"; import \"x.proto\"; message D { x.X x = 1; }",
            &[SchemaReference {
                name: "x.proto".into(),
                subject: "x.proto".into(),
                version: 3,
            }],
        )
        .unwrap();
    let e = c.descriptor(dangling).unwrap_err().to_string();
    assert!(
        e.contains("x.proto") && e.contains(&format!("schema id {dangling}")),
        "{e}"
    );
}

/// Avro writer schemas by id, as `crate::avro` asks for them: parsed; the
/// error kinds the decoder tells apart (unknown, unavailable, invalid, a
/// schema with references), each naming the id.
#[test]
fn avro_schemas_and_error_kinds() {
    let f = Fixture::start(None);
    let c = RegistryClient::new(quick(&f.url)).unwrap();
    let point = r#"{"type":"record","name":"Point","namespace":"geo","fields":[{"name":"x","type":"double"}]}"#;
    c.register("geo.Point", SchemaType::Avro, point, &[])
        .unwrap();
    let trip = r#"{"type":"record","name":"Trip","fields":[{"name":"from","type":"geo.Point"},{"name":"n","type":"long"}]}"#;
    let id = c
        .register(
            "trips-value",
            SchemaType::Avro,
            trip,
            &[SchemaReference {
                name: "geo.Point".into(),
                subject: "geo.Point".into(),
                version: 1,
            }],
        )
        .unwrap();
    // References are refused, naming them (the plan compiler resolves
    // names within one schema).
    let e = SchemaSource::schema(&c, id).unwrap_err();
    assert_eq!((e.id, e.kind), (id, SchemaErrorKind::Invalid));
    assert!(e.to_string().contains("geo.Point"), "{e}");
    let point_id = c
        .register("geo.Point", SchemaType::Avro, point, &[])
        .unwrap();
    let schema = SchemaSource::schema(&c, point_id).unwrap();
    assert!(matches!(&*schema, apache_avro::Schema::Record(r) if r.name.name() == "Point"));

    let e = SchemaSource::schema(&c, 77).unwrap_err();
    assert_eq!((e.id, e.kind), (77, SchemaErrorKind::Unknown));
    let proto = c
        .register(
            "p",
            SchemaType::Protobuf,
            "syntax = \"proto3\"; message M {}",
            &[],
        )
        .unwrap();
    let e = SchemaSource::schema(&c, proto).unwrap_err();
    assert_eq!(e.kind, SchemaErrorKind::Invalid);
    assert!(e.to_string().contains("PROTOBUF"), "{e}");
    let bad = c
        .register("b", SchemaType::Avro, r#"{"type":"nope"}"#, &[])
        .unwrap();
    let e = SchemaSource::schema(&c, bad).unwrap_err();
    assert_eq!(e.kind, SchemaErrorKind::Invalid);
    f.control("POST", "fail?status=503");
    let e = SchemaSource::schema(&c, id + 100).unwrap_err();
    assert_eq!(e.kind, SchemaErrorKind::Unavailable);
    assert!(e.to_string().contains(&f.url), "{e}");
    // The cached schema still answers while the registry is down.
    SchemaSource::schema(&c, point_id).unwrap();
}
