//! The deployment examples of `ops/` (README "Operating spate") read the
//! way spate does: the Kubernetes manifests parse as YAML; the ConfigMap's
//! `spate.yaml` loads through spate's own config loader with exactly the
//! environment the StatefulSet gives the container (every `${NAME}` a
//! secret, the pod's name or a value it sets, no password written in the
//! ConfigMap); static membership is the default (`group.instance.id` is
//! the pod's name, stable in a StatefulSet); the probes and the PodMonitor
//! use the port of the config's `admin.listen` and the paths spate serves;
//! `terminationGracePeriodSeconds` exceeds the preStop sleep plus
//! `shutdown.drain_timeout` plus the final commit and the consumer's close
//! (D5: a drain the kubelet cuts short replays more); the Service, the
//! PodDisruptionBudget and KEDA's ScaledObject select or target the
//! StatefulSet, and the ScaledObject's Kafka trigger reads the config's
//! group, topic, brokers, offset reset and SASL settings. The Dockerfile's
//! shape is checked (two stages, a numeric non-root user that the
//! StatefulSet's `runAsUser` matches, the binary and CA bundle the only
//! files copied into the runtime stage, a HEALTHCHECK on the exposed port,
//! the entrypoint that binary, the default command the StatefulSet's args);
//! `ci/image.sh test` builds and runs it for real, and `ci/image.sh k8s`
//! decodes the manifests strictly into Kubernetes' own types.

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
/// written, values from a secret as a placeholder naming the secret key,
/// values from the pod's fields (the downward API) as `field:PATH`.
fn container_env(container: &Value) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    for e in container["env"].as_sequence().expect("container env") {
        let name = str_of(&e["name"], "env name").to_owned();
        let value = if let Some(v) = e["value"].as_str() {
            v.to_owned()
        } else if let Some(path) = e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
            format!("field:{path}")
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
    let deployment = manifest("k8s/statefulset.yaml", "StatefulSet");
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
        "StatefulSet args vs the image's CMD"
    );
}

/// Every `matchLabels` (or a Service's plain `selector`) entry is a label
/// of the pods.
fn assert_selects(selector: &Value, pods: &serde_norway::Mapping, what: &str) {
    let selector = selector
        .as_mapping()
        .unwrap_or_else(|| panic!("{what}: selector"));
    assert!(!selector.is_empty(), "{what}: an empty selector");
    for (k, v) in selector {
        assert_eq!(pods.get(k), Some(v), "{what} selects the pods ({k:?})");
    }
}

/// Issue 33: a StatefulSet, so each pod's name is stable and is its
/// `group.instance.id` (static membership by default: a restarted pod takes
/// its partitions back without a rebalance); the headless Service, the
/// PodDisruptionBudget and KEDA's ScaledObject select or target it; the
/// ScaledObject's Kafka trigger reads the lag of exactly the config's
/// group, topic and brokers, as the config authenticates, and the KEDA
/// component leaves the replica count to KEDA.
#[test]
fn static_membership_by_default_and_the_service_budget_and_scaler_follow_the_statefulset() {
    let sts = manifest("k8s/statefulset.yaml", "StatefulSet");
    let service = manifest("k8s/service.yaml", "Service");
    let pdb = manifest("k8s/poddisruptionbudget.yaml", "PodDisruptionBudget");
    let configmap = manifest("k8s/configmap.yaml", "ConfigMap");
    let c = &sts["spec"]["template"]["spec"]["containers"][0];
    let env = container_env(c);
    let yaml = str_of(&configmap["data"]["spate.yaml"], "spate.yaml");
    let config = Config::from_yaml(yaml, |name| env.get(name).cloned())
        .unwrap_or_else(|e| panic!("ops/k8s/configmap.yaml spate.yaml: {e}"));
    let kafka = &config.source.kafka;

    assert_eq!(
        kafka
            .properties
            .get("group.instance.id")
            .map(String::as_str),
        Some("field:metadata.name"),
        "group.instance.id is the pod's name (a ${{NAME}} set from fieldRef metadata.name)"
    );

    let pods = pod_labels(&sts);
    assert_selects(
        &sts["spec"]["selector"]["matchLabels"],
        &pods,
        "StatefulSet",
    );
    assert_eq!(
        sts["spec"]["serviceName"], service["metadata"]["name"],
        "the StatefulSet's serviceName is service.yaml"
    );
    assert_eq!(
        service["spec"]["clusterIP"].as_str(),
        Some("None"),
        "a headless Service"
    );
    assert_selects(&service["spec"]["selector"], &pods, "Service");
    assert_selects(
        &pdb["spec"]["selector"]["matchLabels"],
        &pods,
        "PodDisruptionBudget",
    );
    assert_eq!(
        pdb["spec"]["maxUnavailable"].as_u64(),
        Some(1),
        "one pod away at a time, and a single replica can still be drained"
    );
    assert!(
        sts["spec"]["volumeClaimTemplates"].is_null(),
        "spate stores nothing: no volumes claimed"
    );

    // The KEDA component: its files, and the replica count left to KEDA.
    let component = documents("k8s/keda/kustomization.yaml").remove(0);
    assert_eq!(component["kind"].as_str(), Some("Component"));
    for r in component["resources"].as_sequence().expect("resources") {
        let file = str_of(r, "resource");
        assert!(
            ops(&format!("k8s/keda/{file}")).is_file(),
            "keda names {file}"
        );
    }
    let patches = component["patches"].as_sequence().expect("patches");
    assert!(
        patches.iter().any(|p| {
            p["target"]["kind"].as_str() == Some("StatefulSet")
                && p["target"]["name"] == sts["metadata"]["name"]
                && p["patch"]
                    .as_str()
                    .is_some_and(|t| t.contains("op: remove") && t.contains("path: /spec/replicas"))
        }),
        "the KEDA component removes the StatefulSet's spec.replicas"
    );
    let so = manifest("k8s/keda/scaledobject.yaml", "ScaledObject");
    let auth = manifest(
        "k8s/keda/triggerauthentication.yaml",
        "TriggerAuthentication",
    );
    let target = &so["spec"]["scaleTargetRef"];
    assert_eq!(target["kind"].as_str(), Some("StatefulSet"));
    assert_eq!(target["apiVersion"].as_str(), Some("apps/v1"));
    assert_eq!(target["name"], sts["metadata"]["name"], "scaleTargetRef");
    let min = u64_of(&so["spec"]["minReplicaCount"], "minReplicaCount");
    let max = u64_of(&so["spec"]["maxReplicaCount"], "maxReplicaCount");
    assert!(1 <= min && min <= max, "replicas {min}..{max}");
    let triggers = so["spec"]["triggers"].as_sequence().expect("triggers");
    assert_eq!(triggers.len(), 1, "one trigger");
    let t = &triggers[0];
    assert_eq!(t["type"].as_str(), Some("kafka"));
    let m = &t["metadata"];
    let meta = |k: &str| str_of(&m[k], k).to_owned();
    assert_eq!(
        meta("consumerGroup"),
        kafka.group_id,
        "consumerGroup vs group_id"
    );
    assert_eq!(vec![meta("topic")], kafka.topics, "topic vs topics");
    assert_eq!(
        meta("bootstrapServers"),
        kafka.brokers.joined(),
        "bootstrapServers vs the config's brokers"
    );
    assert_eq!(
        meta("offsetResetPolicy"),
        kafka.auto_offset_reset,
        "offsetResetPolicy vs auto_offset_reset (the lag of an uncommitted partition)"
    );
    assert_eq!(
        meta("allowIdleConsumers"),
        "false",
        "no more replicas than partitions"
    );
    let prop = |k: &str| kafka.properties.get(k).map(String::as_str).unwrap_or("");
    let sasl = match prop("sasl.mechanism") {
        "PLAIN" => "plaintext",
        "SCRAM-SHA-256" => "scram_sha256",
        "SCRAM-SHA-512" => "scram_sha512",
        "" => "none",
        other => panic!("sasl.mechanism {other}: add its KEDA name here"),
    };
    assert_eq!(meta("sasl"), sasl, "sasl vs sasl.mechanism");
    let tls = if prop("security.protocol").to_lowercase().ends_with("ssl") {
        "enable"
    } else {
        "disable"
    };
    assert_eq!(meta("tls"), tls, "tls vs security.protocol");
    assert_eq!(
        t["authenticationRef"]["name"], auth["metadata"]["name"],
        "authenticationRef"
    );
    let refs = auth["spec"]["secretTargetRef"]
        .as_sequence()
        .expect("secretTargetRef");
    for (param, var) in [
        ("username", "KAFKA_USERNAME"),
        ("password", "KAFKA_PASSWORD"),
    ] {
        let r = refs
            .iter()
            .find(|r| r["parameter"].as_str() == Some(param))
            .unwrap_or_else(|| panic!("TriggerAuthentication has no {param}"));
        assert_eq!(
            format!(
                "secret:{}/{}",
                str_of(&r["name"], "secret name"),
                str_of(&r["key"], "secret key")
            ),
            env[var],
            "KEDA's {param} is the secret key the pods' {var} reads"
        );
    }
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
                "COPY" | "USER" | "EXPOSE" | "HEALTHCHECK" | "ENTRYPOINT" | "CMD" | "LABEL"
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
    // The HEALTHCHECK asks /healthz on that port, in exec form (bash's
    // /dev/tcp: the image has no curl; ci/image.sh test runs it).
    let health: Vec<&String> = stage
        .iter()
        .filter(|(i, _)| i == "HEALTHCHECK")
        .map(|(_, r)| r)
        .collect();
    assert_eq!(health.len(), 1, "one HEALTHCHECK: {health:?}");
    let cmd = health[0]
        .split_once("CMD ")
        .map(|(_, c)| c)
        .expect("HEALTHCHECK ... CMD [...]");
    let cmd: Vec<String> = serde_json::from_str(cmd).expect("HEALTHCHECK CMD in exec form");
    let script = cmd.last().expect("HEALTHCHECK command");
    assert!(
        script.contains(&format!(
            "/dev/tcp/127.0.0.1/${{SPATE_HEALTHCHECK_PORT:-{port}}}"
        )) && script.contains("GET /healthz "),
        "HEALTHCHECK asks /healthz on port {port}: {script}"
    );
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
