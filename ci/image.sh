#!/usr/bin/env bash
# The container image of ops/docker/Dockerfile, built and run for real
# (issue 33) with podman, on base images made here: no container registry is
# reached (every build and run is --pull=never); the only network is Debian's
# package mirror (debootstrap) and crates.io (the build stage's cargo).
#
#   ci/image.sh base     make the base images when missing (cached under
#                        $SPATE_IMAGE_CACHE, default target/image):
#                        debian:bookworm-slim from `debootstrap --variant=
#                        minbase bookworm`, slimmed as Docker's is (no apt
#                        lists, docs, man pages, locales); rust:<V>-bookworm
#                        (the Dockerfile's build stage, V read from its FROM
#                        line) from the same debootstrap with the packages
#                        the Rust image's build needs (gcc, g++, make, perl,
#                        pkg-config, libc6-dev, zlib1g-dev, libssl-dev, git,
#                        curl, ca-certificates) and this machine's rustup
#                        toolchain of that version (no other can be fetched
#                        here), at the official image's paths
#                        (RUSTUP_HOME=/usr/local/rustup, CARGO_HOME=
#                        /usr/local/cargo)
#   ci/image.sh build    base, then `podman build -f ops/docker/Dockerfile`
#                        from the repository root, tagged $SPATE_IMAGE
#                        (default localhost/spate:dev); prints the image id
#                        and size. The build stage keeps cargo's registry and
#                        target/ in build cache mounts, so a rebuild compiles
#                        what changed only.
#   ci/image.sh run CONFIG
#                        start the image detached as Kubernetes would run it
#                        (ops/k8s/statefulset.yaml): --network host, read-
#                        only root filesystem without tmpfs, every capability
#                        dropped, no new privileges, the image's own user;
#                        CONFIG mounted read-only at /etc/spate/spate.yaml;
#                        the environment variables KAFKA_*, CLICKHOUSE_* and
#                        POD_NAME passed through (for ${NAME} in the config)
#   ci/image.sh test     build, then run the image against ClickHouse 18.16
#                        (ci/clickhouse.sh) and the embedded broker (`spate
#                        broker`, from the same image): move the 20k flight
#                        fixture; check /readyz, /metrics, the healthcheck,
#                        uid/gid 10001, the read-only root, every row landed
#                        and committed, and a SIGTERM drain with exit 0;
#                        stop everything it started
#   ci/image.sh stop     stop and remove the containers started here and the
#                        test's ClickHouse
#   ci/image.sh k8s      check ops/k8s without a cluster (none can be started
#                        here): render ops/k8s and an overlay with the KEDA
#                        component (ops/k8s/keda) with `kubectl kustomize`
#                        (kubectl 1.21 or later: components), then decode
#                        every document strictly into Kubernetes', the
#                        Prometheus Operator's and KEDA's Go types
#                        (ops/k8s/validate, built with the Go toolchain from
#                        the module proxy) and run the static checks of the
#                        API server's validation that need no cluster
#
# Ports (clear of the other scripts' defaults): ClickHouse
# $SPATE_IMAGE_CH_PORT (default 18723, and the two above it), the broker's
# bootstrap port $SPATE_IMAGE_KAFKA_PORT (default 29393), spate's admin
# server $SPATE_IMAGE_ADMIN_PORT (default 19473).
#
# Why the embedded broker and not ci/kafka.sh: the test is about the image
# (libraries, user, paths, signals, probes), not the broker. The embedded
# broker starts in about a second, creates its topic itself and holds the
# fixture well under its 5 MiB-per-partition retention; a real Kafka here
# takes 8-60 s to start and 16 s to stop, 300+ MB per node, and has no topic
# tool on this machine. Static membership, which only a real broker
# implements, is checked against real Kafka by engine/spate/tests/it/
# e2e_report.rs (`a_restart_with_static_membership_...`).
#
# Why podman runs with runc and a lower open-files limit (measured on this
# machine kind, a container itself): crun 1.8 refuses its hybrid cgroup
# layout ("cgroups in hybrid mode not supported"), and podman's default
# RLIMIT_NOFILE and RLIMIT_NPROC (1048576, 4194304) are above the hard
# limits here, which root cannot raise without CAP_SYS_RESOURCE (runc was
# refused an RLIMIT_NPROC above 32768, though the shell's is 96363): the
# shell's open-files limit and at most 32768 processes are used instead. Both are set in a containers.conf of our
# own ($SPATE_IMAGE_CACHE/containers.conf via CONTAINERS_CONF); override
# with SPATE_IMAGE_RUNTIME. podman and debootstrap are installed with
# apt-get when missing. Builds run under `nice -n $SPATE_IMAGE_NICE`
# (default 15).
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
CACHE="${SPATE_IMAGE_CACHE:-$REPO/target/image}"
IMAGE="${SPATE_IMAGE:-localhost/spate:dev}"
MIRROR="${SPATE_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
NICE="${SPATE_IMAGE_NICE:-15}"
RUNTIME="${SPATE_IMAGE_RUNTIME:-runc}"
CH_PORT="${SPATE_IMAGE_CH_PORT:-18723}"
CH_DIR="${SPATE_IMAGE_CH_DIR:-/tmp/spate-image-ch}"
KAFKA_PORT="${SPATE_IMAGE_KAFKA_PORT:-29393}"
ADMIN_PORT="${SPATE_IMAGE_ADMIN_PORT:-19473}"
FIXTURE="$REPO/engine/spate/fixtures/flights-20k.ndjson"
DOCKERFILE="$REPO/ops/docker/Dockerfile"
# Container names: one prefix, so `stop` removes exactly ours.
PREFIX="spate-image"

log() { printf 'image.sh: %s\n' "$*" >&2; }
die() {
  log "FAILED: $*"
  exit 1
}

install_if_missing() {
  local need=()
  command -v podman >/dev/null || need+=(podman)
  command -v "$RUNTIME" >/dev/null || need+=("$RUNTIME")
  command -v debootstrap >/dev/null || need+=(debootstrap)
  command -v curl >/dev/null || need+=(curl)
  [ ${#need[@]} -eq 0 ] && return
  log "installing ${need[*]} (Debian packages)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/dev/null
}

# podman with our containers.conf (runtime, open-files limit).
pm() { CONTAINERS_CONF="$CACHE/containers.conf" podman "$@"; }

setup() {
  install_if_missing
  mkdir -p "$CACHE"
  local nofile nproc
  nofile=$(ulimit -Hn)
  nproc=$(ulimit -Hu)
  [ "$nofile" = unlimited ] && nofile=1048576
  { [ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ]; } && nproc=32768
  cat >"$CACHE/containers.conf" <<EOF
# Written by ci/image.sh (see its header for why).
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]
[engine]
runtime = "$RUNTIME"
EOF
}

# The Rust version of the Dockerfile's build stage (FROM rust:V-bookworm).
rust_version() {
  sed -n 's/^FROM rust:\([0-9.]*\)-bookworm.*/\1/p' "$DOCKERFILE" | head -n1
}

# debootstrap minbase bookworm (plus packages) into $1, apt caches removed.
bootstrap() {
  local dir="$1" include="${2:-}"
  rm -rf "$dir"
  log "debootstrap --variant=minbase bookworm ${include:+(+ $include) }into $dir"
  nice -n "$NICE" debootstrap --variant=minbase ${include:+--include="$include"} \
    bookworm "$dir" "$MIRROR" >"$dir.log" 2>&1 || {
    tail -n 20 "$dir.log" >&2
    die "debootstrap (log: $dir.log)"
  }
  rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/* \
    "$dir"/var/log/* "$dir"/tmp/* "$dir"/var/cache/debconf/*-old
}

# tar $1 and import it as image $2 with the given Dockerfile changes.
import_rootfs() {
  local dir="$1" ref="$2"
  shift 2
  local changes=()
  for c in "$@"; do changes+=(--change "$c"); done
  tar --numeric-owner -C "$dir" -cf "$dir.tar" .
  pm import -q "${changes[@]}" "$dir.tar" "$ref" >/dev/null
  rm -f "$dir.tar"
}

base() {
  setup
  local slim="docker.io/library/debian:bookworm-slim"
  if ! pm image exists "$slim"; then
    local dir="$CACHE/rootfs/bookworm-slim"
    if [ ! -f "$dir/.done" ]; then
      bootstrap "$dir"
      # Docker's bookworm-slim drops these too (keeping the copyright files).
      find "$dir/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
      find "$dir/usr/share/doc" -mindepth 1 -type d -empty -delete
      rm -rf "$dir"/usr/share/man/* "$dir"/usr/share/info/* "$dir"/usr/share/locale/* \
        "$dir"/usr/share/lintian "$dir"/usr/share/linda
      touch "$dir/.done"
    fi
    log "importing $dir as $slim"
    import_rootfs "$dir" "$slim" \
      'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      'CMD ["bash"]' \
      'LABEL org.opencontainers.image.description=made-locally-by-ci/image.sh-from-debootstrap-minbase-bookworm'
  fi
  local v
  v=$(rust_version)
  [ -n "$v" ] || die "no 'FROM rust:V-bookworm' in $DOCKERFILE"
  local rust="docker.io/library/rust:$v-bookworm"
  if ! pm image exists "$rust"; then
    local sysroot host
    sysroot=$(rustc --print sysroot)
    host=$(rustc -vV | sed -n 's/^release: //p')
    case "$host" in
    "$v" | "$v".*) ;;
    *) die "the Dockerfile builds with Rust $v; this machine's rustc is $host" ;;
    esac
    local dir="$CACHE/rootfs/rust-$v-bookworm"
    if [ ! -f "$dir/.done" ]; then
      bootstrap "$dir" ca-certificates,curl,git,gcc,g++,make,perl,pkg-config,libc6-dev,zlib1g-dev,libssl-dev
      local tc="$dir/usr/local/rustup/toolchains/$host-x86_64-unknown-linux-gnu"
      mkdir -p "$tc" "$dir/usr/local/cargo/bin"
      log "copying the toolchain $sysroot (rustc $host, without its docs)"
      tar -C "$sysroot" --exclude=./share/doc -cf - . | tar -C "$tc" -xf -
      for b in "$tc"/bin/*; do
        ln -s "../../rustup/toolchains/$(basename "$tc")/bin/$(basename "$b")" \
          "$dir/usr/local/cargo/bin/$(basename "$b")"
      done
      touch "$dir/.done"
    fi
    log "importing $dir as $rust"
    import_rootfs "$dir" "$rust" \
      'ENV RUSTUP_HOME=/usr/local/rustup' \
      'ENV CARGO_HOME=/usr/local/cargo' \
      "ENV RUST_VERSION=$host" \
      'ENV PATH=/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      'CMD ["bash"]' \
      'LABEL org.opencontainers.image.description=made-locally-by-ci/image.sh-from-debootstrap-and-the-host-rustup-toolchain'
  fi
}

build() {
  base
  local t0=$SECONDS
  log "podman build -f ops/docker/Dockerfile -t $IMAGE $REPO"
  # --format docker keeps the HEALTHCHECK (the OCI format has none);
  # --network host: the build stage's cargo fetches crates.io.
  # A TLS-intercepting proxy's CA (the build secret `ca` of the Dockerfile).
  local ca="${SPATE_IMAGE_CA_FILE:-${SSL_CERT_FILE:-}}" secret=()
  [ -n "$ca" ] && [ -f "$ca" ] && secret=(--secret "id=ca,src=$ca")
  nice -n "$NICE" env CONTAINERS_CONF="$CACHE/containers.conf" \
    podman build --pull=never --format docker --network host "${secret[@]}" \
    -f "$DOCKERFILE" -t "$IMAGE" "$REPO" >&2
  local id size
  id=$(pm image inspect --format '{{.Id}}' "$IMAGE")
  size=$(pm image inspect --format '{{.Size}}' "$IMAGE")
  log "built in $((SECONDS - t0)) s"
  echo "image $IMAGE id $id size $size bytes ($((size / 1024 / 1024)) MiB)"
}

# run_container NAME CONFIG [podman run flags...]: the image as the
# StatefulSet runs it (see `run` in the header).
run_container() {
  local name="$1" config="$2"
  shift 2
  pm run -d --pull=never --name "$name" --network host \
    --read-only --read-only-tmpfs=false \
    --cap-drop=ALL --security-opt=no-new-privileges \
    -v "$config:/etc/spate/spate.yaml:ro" \
    -e 'KAFKA_*' -e 'CLICKHOUSE_*' -e POD_NAME \
    "$@" "$IMAGE" >/dev/null
}

run() {
  [ $# -ge 1 ] || die "usage: ci/image.sh run CONFIG"
  setup
  local config
  config="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
  run_container "$PREFIX-run" "$config"
  echo "$PREFIX-run"
}

stop() {
  trap - EXIT
  setup
  local names
  names=$(pm ps -a --format '{{.Names}}' | grep "^$PREFIX-" || true)
  for n in $names; do
    pm stop -t 60 "$n" >/dev/null 2>&1 || true
    pm rm -f "$n" >/dev/null 2>&1 || true
    log "removed $n"
  done
  if [ -d "$CH_DIR" ]; then
    SPATE_CH_DIR="$CH_DIR" SPATE_CH_BASE_PORT="$CH_PORT" bash "$HERE/clickhouse.sh" stop >/dev/null 2>&1 || true
  fi
}

ch() { curl -fsS --max-time 10 "$CH_URL/" --data-binary "$1"; }

# The sum of a metric family's samples (all label sets) on the admin server.
metric_sum() {
  curl -fsS --max-time 5 "http://127.0.0.1:$ADMIN_PORT/metrics" |
    awk -v m="$1" '$1 == m || index($1, m "{") == 1 { s += $NF } END { printf "%d\n", s }'
}

# wait_for SECONDS DESCRIPTION COMMAND...: until COMMAND succeeds.
wait_for() {
  local secs="$1" what="$2"
  shift 2
  local t0=$SECONDS
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS - t0 >= secs)); then
      pm logs --tail 30 "$PREFIX-spate" >&2 2>&1 || true
      die "$what: not within $secs s"
    fi
    sleep 0.5
  done
  log "$what after $((SECONDS - t0)) s"
}

readyz_ok() { [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 3 "http://127.0.0.1:$ADMIN_PORT/readyz")" = 200 ]; }
rows_landed() { [ "$(ch "SELECT count() FROM default.flights_image")" = "$1" ]; }
rows_above() { [ "$(ch "SELECT count() FROM default.flights_image")" -gt "$1" ]; }
broker_up() { pm logs "$PREFIX-broker" 2>/dev/null | grep -qx "127.0.0.1:$KAFKA_PORT"; }
committed() { [ "$(metric_sum spate_committed_offset)" = "$1" ]; }

test_image() {
  local t0=$SECONDS
  build
  local built=$SECONDS
  stop
  trap stop EXIT
  local rows
  rows=$(wc -l <"$FIXTURE")

  CH_URL=$(SPATE_CH_DIR="$CH_DIR" SPATE_CH_BASE_PORT="$CH_PORT" bash "$HERE/clickhouse.sh" start 1 | head -n1)
  ch "CREATE TABLE default.flights_image (date DateTime, delay Int32, distance UInt32, origin String, destination String) ENGINE = MergeTree ORDER BY (origin, date)"

  # The broker, from the same image (read-only root too).
  pm run -d --pull=never --name "$PREFIX-broker" --network host --read-only --read-only-tmpfs=false \
    --cap-drop=ALL --no-healthcheck "$IMAGE" broker --port "$KAFKA_PORT" --topic flights --partitions 4 >/dev/null
  wait_for 30 "embedded broker up" broker_up
  pm run --rm --pull=never --network host --read-only --read-only-tmpfs=false --cap-drop=ALL \
    --no-healthcheck -v "$FIXTURE:/data/flights.ndjson:ro" "$IMAGE" \
    produce --brokers "127.0.0.1:$KAFKA_PORT" --topic flights /data/flights.ndjson >&2

  mkdir -p "$CACHE/test"
  local config="$CACHE/test/spate.yaml"
  cat >"$config" <<EOF
# Written by ci/image.sh test.
pipeline: { name: image-test, threads: 2 }
checkpoint: { interval: 1s }
source:
  kafka:
    brokers: \${KAFKA_BROKERS}
    topics: [flights]
    group_id: spate-image-test
    auto_offset_reset: earliest
    properties:
      session.timeout.ms: "6000"
      # As ops/k8s/statefulset.yaml sets it (the pod's name).
      group.instance.id: \${POD_NAME}
format:
  json: { time_formats: ["%Y/%m/%d %H:%M"] }
on_error: { policy: fail }
sink:
  clickhouse:
    shards: [["\${CLICKHOUSE_URL}"]]
    database: default
    table: flights_image
    batch: { max_rows: 5000, max_bytes: 64MiB, linger: 200ms }
shutdown: { drain_timeout: 30s }
admin: { listen: "127.0.0.1:$ADMIN_PORT" }
EOF
  # No healthcheck timer (podman schedules it with systemd, absent here):
  # the check below runs it by hand.
  KAFKA_BROKERS="127.0.0.1:$KAFKA_PORT" CLICKHOUSE_URL="$CH_URL" POD_NAME="spate-flights-0" \
    run_container "$PREFIX-spate" "$config" --health-interval=disable \
    -e SPATE_HEALTHCHECK_PORT="$ADMIN_PORT"
  local started=$SECONDS

  wait_for 60 "/readyz 200" readyz_ok
  log "/readyz: $(curl -fsS "http://127.0.0.1:$ADMIN_PORT/readyz" | head -c 200)"
  wait_for 60 "$rows rows in ClickHouse" rows_landed "$rows"
  wait_for 30 "offsets committed up to $rows" committed "$rows"

  # /metrics: the run's own counters.
  local written polled
  written=$(metric_sum spate_sink_rows_written_total)
  polled=$(metric_sum spate_records_polled_total)
  [ "$written" = "$rows" ] || die "/metrics spate_sink_rows_written_total $written, expected $rows"
  [ "$polled" = "$rows" ] || die "/metrics spate_records_polled_total $polled, expected $rows"
  [ "$(metric_sum spate_ready)" = 1 ] || die "/metrics spate_ready is not 1"
  local metrics
  metrics=$(curl -fsS "http://127.0.0.1:$ADMIN_PORT/metrics")
  grep -q '^spate_build_info{' <<<"$metrics" || die "/metrics has no spate_build_info"
  log "/metrics: rows written $written, polled $polled, committed $rows, spate_ready 1"

  # The process: uid/gid 10001 (the kernel's view), read-only root.
  local pid uid gid
  pid=$(pm inspect --format '{{.State.Pid}}' "$PREFIX-spate")
  uid=$(awk '/^Uid:/ { print $2, $3, $4, $5 }' "/proc/$pid/status")
  gid=$(awk '/^Gid:/ { print $2, $3, $4, $5 }' "/proc/$pid/status")
  [ "$uid" = "10001 10001 10001 10001" ] || die "uid of pid $pid: $uid"
  [ "$gid" = "10001 10001 10001 10001" ] || die "gid of pid $pid: $gid"
  [ "$(tr '\0' ' ' <"/proc/$pid/cmdline")" = "/usr/local/bin/spate run -c /etc/spate/spate.yaml --log-format json " ] ||
    die "cmdline: $(tr '\0' ' ' <"/proc/$pid/cmdline")"
  log "process $pid: uid $uid, gid $gid, $(tr '\0' ' ' <"/proc/$pid/cmdline")"
  # As root in the container (owner of /, so only a read-only mount stops
  # it; uid 10001 would be refused by permissions alone).
  local d out
  for d in / /tmp /run /var/tmp; do
    if out=$(pm exec --user 0 "$PREFIX-spate" touch "$d/probe" 2>&1); then
      die "$d is writable"
    fi
    case "$out" in *"Read-only file system"*) ;; *) die "touch $d/probe: $out" ;; esac
  done
  log "root filesystem read-only (/, /tmp, /run, /var/tmp): $out"

  # The image's HEALTHCHECK.
  pm healthcheck run "$PREFIX-spate" >&2 || die "HEALTHCHECK: unhealthy"
  log "HEALTHCHECK: healthy"

  # SIGTERM: the drain, exit 0.
  local term=$SECONDS rc
  pm kill --signal TERM "$PREFIX-spate" >/dev/null
  rc=$(pm wait "$PREFIX-spate")
  log "SIGTERM: exit $rc after $((SECONDS - term)) s"
  [ "$rc" = 0 ] || {
    pm logs --tail 30 "$PREFIX-spate" >&2
    die "exit $rc after SIGTERM"
  }
  pm logs "$PREFIX-spate" 2>&1 | tail -n 3 >&2
  rows_landed "$rows" || die "the count moved after the drain: $(ch "SELECT count() FROM default.flights_image")"

  # A second load, SIGTERM as soon as its first rows land (in flight when
  # the load is slower than here; the log says how many had landed), then
  # a restart into the same group with the same group.instance.id: every
  # row lands once (the drain commits what it delivered; the restart reads
  # the rest from there).
  pm rm "$PREFIX-spate" >/dev/null
  pm run --rm --pull=never --network host --read-only --read-only-tmpfs=false --cap-drop=ALL \
    --no-healthcheck -v "$FIXTURE:/data/flights.ndjson:ro" "$IMAGE" \
    produce --brokers "127.0.0.1:$KAFKA_PORT" --topic flights /data/flights.ndjson >&2
  KAFKA_BROKERS="127.0.0.1:$KAFKA_PORT" CLICKHOUSE_URL="$CH_URL" POD_NAME="spate-flights-0" \
    run_container "$PREFIX-spate" "$config" --no-healthcheck
  wait_for 60 "rows of the second load landing" rows_above "$rows"
  pm kill --signal TERM "$PREFIX-spate" >/dev/null
  rc=$(pm wait "$PREFIX-spate")
  local mid
  mid=$(ch "SELECT count() FROM default.flights_image")
  log "SIGTERM as the second load lands: exit $rc, $mid of $((2 * rows)) rows in the table"
  [ "$rc" = 0 ] || die "exit $rc after SIGTERM during the second load"
  pm rm "$PREFIX-spate" >/dev/null
  KAFKA_BROKERS="127.0.0.1:$KAFKA_PORT" CLICKHOUSE_URL="$CH_URL" POD_NAME="spate-flights-0" \
    run_container "$PREFIX-spate" "$config" --no-healthcheck
  wait_for 90 "offsets committed up to $((2 * rows)) after the restart" committed "$((2 * rows))"
  rows_landed "$((2 * rows))" ||
    die "after the restart $(ch "SELECT count() FROM default.flights_image") rows, expected $((2 * rows))"
  log "restart: $((2 * rows)) rows, each once"

  log "PASSED: $rows rows; build $((built - t0)) s, run to drained $((SECONDS - started)) s, total $((SECONDS - t0)) s"
}

k8s() {
  command -v kubectl >/dev/null || die "kubectl (1.21 or later) is needed to render ops/k8s"
  command -v go >/dev/null || die "go is needed to build ops/k8s/validate"
  local dir="$CACHE/k8s"
  mkdir -p "$dir/keda-overlay"
  kubectl kustomize "$REPO/ops/k8s" >"$dir/default.yaml"
  local rel
  rel=$(realpath --relative-to="$dir/keda-overlay" "$REPO/ops/k8s")
  cat >"$dir/keda-overlay/kustomization.yaml" <<EOF
# Written by ci/image.sh k8s: the overlay ops/k8s/keda/kustomization.yaml shows.
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources: [ $rel ]
components: [ $rel/keda ]
EOF
  kubectl kustomize "$dir/keda-overlay" >"$dir/keda.yaml"
  if grep -q '^  replicas:' "$dir/keda.yaml"; then
    die "the KEDA overlay still sets spec.replicas"
  fi
  log "building ops/k8s/validate"
  (cd "$REPO/ops/k8s/validate" && nice -n "$NICE" go build -o "$dir/validate" .)
  (cd "$dir" && ./validate default.yaml keda.yaml "$REPO/ops/k8s/secret.example.yaml")
}

case "${1:-}" in
base) base ;;
k8s) k8s ;;
build) build ;;
run) shift && run "$@" ;;
test) test_image ;;
stop) stop ;;
*)
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
  exit 2
  ;;
esac
