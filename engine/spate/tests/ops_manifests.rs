//! The deployment examples of `ops/` (README "Operating spate") read the
//! way spate does: the Kubernetes manifests parse as YAML; the ConfigMap's
//! `spate.yaml` loads through spate's own config loader with exactly the
//! environment the Deployment gives the container (every `${NAME}` a
//! secret or value it sets, no password written in the ConfigMap); the
//! probes and the PodMonitor use the port of the config's `admin.listen`
//! and the paths spate serves; `terminationGracePeriodSeconds` exceeds the
//! preStop sleep plus `shutdown.drain_timeout` plus the final commit and
//! the consumer's close (D5: a drain the kubelet cuts short replays more).
//! The Dockerfile cannot be built here (no Docker engine): its shape is
//! checked (two stages, a numeric non-root user that the Deployment's
//! `runAsUser` matches, the binary and CA bundle the only files copied into
//! the runtime stage, the entrypoint that binary, the default command the
//! Deployment's args).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use serde_norway::Value;
use spate::config::Config;

fn ops(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../ops")
        .join(path)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(ops(path)).unwrap_or_else(|e| panic!("ops/{path}: {e}"))
}

/// Every YAML document of `ops/{path}`.
fn documents(path: &str) -> Vec<Value> {
    let text = read(path);
    serde_norway::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).unwrap_or_else(|e| panic!("ops/{path}: {e}")))
        .collect()
}

/// The one document of `ops/{path}`, checked to be of `kind`.
fn manifest(path: &str, kind: &str) -> Value {
    let docs = documents(path);
    assert_eq!(docs.len(), 1, "ops/{path}: one document");
    let doc = docs.into_iter().next().unwrap();
    assert_eq!(doc["kind"].as_str(), Some(kind), "ops/{path}: kind");
    assert!(
        doc["apiVersion"].as_str().is_some(),
        "ops/{path}: apiVersion"
    );
    doc
}

fn str_of<'a>(v: &'a Value, what: &str) -> &'a str {
    v.as_str()
        .unwrap_or_else(|| panic!("{what}: expected a string, got {v:?}"))
}

fn u64_of(v: &Value, what: &str) -> u64 {
    v.as_u64()
        .unwrap_or_else(|| panic!("{what}: expected a number, got {v:?}"))
}

/// The container's environment as spate would see it: literal values as
/// written, values from a secret as a placeholder naming the secret key.
fn container_env(container: &Value) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    for e in container["env"].as_sequence().expect("container env") {
        let name = str_of(&e["name"], "env name").to_owned();
        let value = if let Some(v) = e["value"].as_str() {
            v.to_owned()
        } else {
            let key = &e["valueFrom"]["secretKeyRef"];
            format!(
                "secret:{}/{}",
                str_of(&key["name"], "secretKeyRef name"),
                str_of(&key["key"], "secretKeyRef key")
            )
        };
        assert!(
            env.insert(name.clone(), value).is_none(),
            "env {name} twice"
        );
    }
    env
}

/// The containerPort a probe's `port` (a name or a number) means.
fn resolve_port(container: &Value, port: &Value) -> u64 {
    if let Some(n) = port.as_u64() {
        return n;
    }
    let name = str_of(port, "probe port");
    container["ports"]
        .as_sequence()
        .expect("container ports")
        .iter()
        .find(|p| p["name"].as_str() == Some(name))
        .map(|p| u64_of(&p["containerPort"], "containerPort"))
        .unwrap_or_else(|| panic!("no container port named {name}"))
}

#[test]
fn k8s_manifests_match_the_configmaps_admin_section_and_outlast_the_drain() {
    let configmap = manifest("k8s/configmap.yaml", "ConfigMap");
    let deployment = manifest("k8s/deployment.yaml", "Deployment");
    let podmonitor = manifest("k8s/podmonitor.yaml", "PodMonitor");
    manifest("k8s/prometheusrule.yaml", "PrometheusRule");
    let secret = manifest("k8s/secret.example.yaml", "Secret");
    // kustomization.yaml lists the files that exist.
    let kustomization = documents("k8s/kustomization.yaml").remove(0);
    for r in kustomization["resources"].as_sequence().expect("resources") {
        let file = str_of(r, "resource");
        assert!(
            ops(&format!("k8s/{file}")).is_file(),
            "kustomization names {file}"
        );
    }

    let pod = &deployment["spec"]["template"]["spec"];
    let containers = pod["containers"].as_sequence().expect("containers");
    assert_eq!(containers.len(), 1, "one container");
    let c = &containers[0];

    // The config file the container reads is the ConfigMap's key, mounted.
    let args: Vec<&str> = c["args"]
        .as_sequence()
        .expect("args")
        .iter()
        .map(|a| str_of(a, "arg"))
        .collect();
    let file = args[args.iter().position(|a| *a == "-c").expect("-c in args") + 1];
    let mount = c["volumeMounts"]
        .as_sequence()
        .expect("volumeMounts")
        .iter()
        .find(|m| file.starts_with(&format!("{}/", str_of(&m["mountPath"], "mountPath"))))
        .unwrap_or_else(|| panic!("no volume mounted where {file} is"));
    let key = &file[str_of(&mount["mountPath"], "mountPath").len() + 1..];
    let volume = pod["volumes"]
        .as_sequence()
        .expect("volumes")
        .iter()
        .find(|v| v["name"] == mount["name"])
        .expect("the mounted volume");
    assert_eq!(
        volume["configMap"]["name"], configmap["metadata"]["name"],
        "the volume is the ConfigMap"
    );
    let yaml = str_of(&configmap["data"][key], "ConfigMap data key the args name");

    // Secrets come from the environment: the config loads with exactly the
    // container's env (an unset ${NAME} fails the load), and no password
    // is written in the ConfigMap.
    let env = container_env(c);
    let config = Config::from_yaml(yaml, |name| env.get(name).cloned())
        .unwrap_or_else(|e| panic!("ops/k8s/configmap.yaml {key}: {e}"));
    for line in yaml.lines().filter(|l| l.contains("password:")) {
        assert!(
            line.contains("${"),
            "a password written in the ConfigMap: {line}"
        );
    }
    let secret_keys: Vec<&str> = secret["stringData"]
        .as_mapping()
        .expect("stringData")
        .keys()
        .map(|k| str_of(k, "secret key"))
        .collect();
    for (name, value) in &env {
        if let Some(r) = value.strip_prefix("secret:") {
            let (secret_name, k) = r.split_once('/').unwrap();
            assert_eq!(
                Some(secret_name),
                secret["metadata"]["name"].as_str(),
                "{name}'s secret"
            );
            assert!(
                secret_keys.contains(&k),
                "{name}: key {k} not in secret.example.yaml"
            );
        }
    }

    // Probes and the PodMonitor on the admin server's port and paths.
    let admin: SocketAddr = config.admin.listen.parse().expect("admin.listen");
    assert!(
        admin.ip().is_unspecified(),
        "admin.listen {admin}: the kubelet and Prometheus reach the pod IP, not loopback"
    );
    for (probe, path) in [
        ("livenessProbe", "/healthz"),
        ("readinessProbe", "/readyz"),
        ("startupProbe", "/healthz"),
    ] {
        let get = &c[probe]["httpGet"];
        assert_eq!(get["path"].as_str(), Some(path), "{probe} path");
        assert_eq!(
            resolve_port(c, &get["port"]),
            u64::from(admin.port()),
            "{probe} port vs admin.listen {admin}"
        );
    }
    let endpoints = podmonitor["spec"]["podMetricsEndpoints"]
        .as_sequence()
        .expect("podMetricsEndpoints");
    for e in endpoints {
        assert_eq!(e["path"].as_str(), Some("/metrics"), "PodMonitor path");
        assert_eq!(
            resolve_port(c, &e["port"]),
            u64::from(admin.port()),
            "PodMonitor port vs admin.listen {admin}"
        );
    }
    let labels = &pod_labels(&deployment);
    for (k, v) in podmonitor["spec"]["selector"]["matchLabels"]
        .as_mapping()
        .expect("PodMonitor matchLabels")
    {
        assert_eq!(
            labels.get(k),
            Some(v),
            "PodMonitor selects the pods ({k:?})"
        );
    }

    // The grace period outlasts preStop + drain + final commit + close.
    let grace = Duration::from_secs(u64_of(
        &pod["terminationGracePeriodSeconds"],
        "terminationGracePeriodSeconds",
    ));
    let pre_stop = c["lifecycle"]["preStop"]["exec"]["command"]
        .as_sequence()
        .expect("preStop exec command");
    assert_eq!(pre_stop[0].as_str(), Some("sleep"), "preStop sleeps");
    let sleep = Duration::from_secs(
        str_of(&pre_stop[1], "sleep seconds")
            .parse()
            .expect("sleep seconds"),
    );
    let drain = config.shutdown.drain_timeout.0;
    let needed = sleep + drain + spate_kafka::COMMIT_TIMEOUT + spate_kafka::CLOSE_TIMEOUT;
    println!(
        "grace {grace:?}, needed {needed:?} (preStop {sleep:?} + drain {drain:?} + commit \
         {:?} + close {:?})",
        spate_kafka::COMMIT_TIMEOUT,
        spate_kafka::CLOSE_TIMEOUT
    );
    assert!(
        grace > needed,
        "terminationGracePeriodSeconds {grace:?} must exceed {needed:?} (preStop {sleep:?} + \
         shutdown.drain_timeout {drain:?} + final commit + consumer close)"
    );

    // Non-root, as the image's numeric user.
    let sc = &pod["securityContext"];
    assert_eq!(sc["runAsNonRoot"].as_bool(), Some(true), "runAsNonRoot");
    let (uid, _) = dockerfile_user();
    assert_eq!(
        u64_of(&sc["runAsUser"], "runAsUser"),
        uid,
        "runAsUser vs the Dockerfile's USER"
    );
    assert_eq!(
        args,
        dockerfile_json("CMD"),
        "Deployment args vs the image's CMD"
    );
}

fn pod_labels(deployment: &Value) -> serde_norway::Mapping {
    deployment["spec"]["template"]["metadata"]["labels"]
        .as_mapping()
        .expect("pod labels")
        .clone()
}

/// The Dockerfile's instructions as (instruction, rest), continuation lines
/// joined, comments dropped.
fn dockerfile() -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in read("docker/Dockerfile").lines() {
        let line = line.trim();
        if line.starts_with('#') || (line.is_empty() && current.is_empty()) {
            continue;
        }
        if let Some(head) = line.strip_suffix('\\') {
            current.push_str(head);
            current.push(' ');
            continue;
        }
        current.push_str(line);
        if let Some((ins, rest)) = current.trim().split_once(char::is_whitespace) {
            out.push((ins.to_uppercase(), rest.trim().to_owned()));
        }
        current.clear();
    }
    out
}

/// The instructions of the last stage.
fn runtime_stage() -> Vec<(String, String)> {
    let all = dockerfile();
    let last = all.iter().rposition(|(i, _)| i == "FROM").expect("FROM");
    all[last..].to_vec()
}

/// The runtime stage's `USER uid:gid`.
fn dockerfile_user() -> (u64, u64) {
    let stage = runtime_stage();
    let users: Vec<&String> = stage
        .iter()
        .filter(|(i, _)| i == "USER")
        .map(|(_, r)| r)
        .collect();
    assert_eq!(users.len(), 1, "one USER in the runtime stage");
    let (uid, gid) = users[0].split_once(':').expect("USER uid:gid");
    let (uid, gid): (u64, u64) = (
        uid.parse().expect("numeric uid"),
        gid.parse().expect("numeric gid"),
    );
    assert!(uid > 0 && gid > 0, "USER {uid}:{gid} is root");
    (uid, gid)
}

/// A JSON-form instruction (`ENTRYPOINT`, `CMD`) of the runtime stage.
fn dockerfile_json(ins: &str) -> Vec<String> {
    let stage = runtime_stage();
    let (_, rest) = stage
        .iter()
        .find(|(i, _)| i == ins)
        .unwrap_or_else(|| panic!("no {ins} in the runtime stage"));
    serde_json::from_str(rest).unwrap_or_else(|e| panic!("{ins} {rest}: exec form expected: {e}"))
}

#[test]
fn dockerfile_is_multi_stage_non_root_and_ships_the_binary_only() {
    let all = dockerfile();
    let froms: Vec<&String> = all
        .iter()
        .filter(|(i, _)| i == "FROM")
        .map(|(_, r)| r)
        .collect();
    assert!(froms.len() >= 2, "multi-stage: {froms:?}");
    let build = froms[0]
        .split_whitespace()
        .last()
        .expect("build stage name");
    assert!(
        froms[0].to_lowercase().contains(" as "),
        "the build stage is named"
    );
    // The build is locked and builds this binary.
    assert!(
        all.iter()
            .any(|(i, r)| i == "RUN" && r.contains("cargo build --release --locked -p spate")),
        "cargo build --release --locked -p spate"
    );

    let stage = runtime_stage();
    for (ins, rest) in &stage[1..] {
        assert!(
            matches!(
                ins.as_str(),
                "COPY" | "USER" | "EXPOSE" | "ENTRYPOINT" | "CMD" | "LABEL"
            ),
            "the runtime stage adds nothing but the binary: {ins} {rest}"
        );
    }
    let copies: Vec<Vec<&str>> = stage
        .iter()
        .filter(|(i, _)| i == "COPY")
        .map(|(_, r)| r.split_whitespace().collect())
        .collect();
    let from_build = format!("--from={build}");
    for c in &copies {
        assert_eq!(c[0], from_build, "COPY only from the build stage: {c:?}");
    }
    let targets: Vec<&str> = copies.iter().map(|c| *c.last().unwrap()).collect();
    assert_eq!(
        targets,
        ["/usr/local/bin/spate", "/etc/ssl/certs/ca-certificates.crt"],
        "the binary and the CA bundle"
    );
    dockerfile_user();
    assert_eq!(dockerfile_json("ENTRYPOINT"), ["/usr/local/bin/spate"]);
    let cmd = dockerfile_json("CMD");
    assert_eq!(cmd[0], "run", "CMD runs the service: {cmd:?}");
    // The admin port the image exposes is the ConfigMap's.
    let expose: Vec<&String> = stage
        .iter()
        .filter(|(i, _)| i == "EXPOSE")
        .map(|(_, r)| r)
        .collect();
    let configmap = manifest("k8s/configmap.yaml", "ConfigMap");
    let yaml = str_of(&configmap["data"]["spate.yaml"], "spate.yaml");
    let config = Config::from_yaml(yaml, |_| Some("x".into())).expect("ConfigMap config");
    let port = config
        .admin
        .listen
        .parse::<SocketAddr>()
        .expect("admin.listen")
        .port();
    assert_eq!(expose, [&port.to_string()], "EXPOSE vs admin.listen");
}

/// `ops/k8s/prometheusrule.yaml` holds exactly the groups of
/// `ops/prometheus/alerts.yml` (it is generated from it by
/// `ops/prometheus/render.py --prometheus-rule`), so the two cannot drift.
#[test]
fn the_prometheus_rule_manifest_holds_the_alert_rules_unchanged() {
    let rule = manifest("k8s/prometheusrule.yaml", "PrometheusRule");
    let alerts = documents("prometheus/alerts.yml").remove(0);
    assert!(
        alerts["groups"]
            .as_sequence()
            .is_some_and(|g| !g.is_empty()),
        "alerts.yml has groups"
    );
    assert!(
        rule["spec"]["groups"] == alerts["groups"],
        "ops/k8s/prometheusrule.yaml is stale: python3 ops/prometheus/render.py \
         --prometheus-rule > ops/k8s/prometheusrule.yaml"
    );
    assert_eq!(
        rule["metadata"]["labels"]["app.kubernetes.io/name"].as_str(),
        Some("spate")
    );
}
