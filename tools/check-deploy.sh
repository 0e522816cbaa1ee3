#!/usr/bin/env bash
# Validates deploy/: the systemd units, the example env file, the nginx config, and that they
# agree with each other. Exits non-zero on any real error; a check that cannot run here says
# SKIP on its own line.
#
#   1. consistency (bash only): directives the design relies on are present in both units and
#      identical where they must be; TimeoutStopSec covers the drain timeout; nginx accepts
#      bodies as large as the server; env file syntax, and its keys against the `serve` flags'
#      LIMELIGHT_* names once src/ defines them;
#   2. `systemd-analyze verify` on both units (the template as instance limelight@3), with
#      warnings about our files counted as errors, and `systemd-analyze security --offline`
#      with an exposure threshold;
#   3. `nginx -t` on a wrapper that includes deploy/nginx/limelight.conf inside `http {}`;
#   4. a smoke test of that config: nginx in front of stub upstreams (one answering 503 like a
#      draining instance): audio is streamed, not buffered; 503s fail over; upstream
#      connections are kept alive; the body limit; /metrics is not exposed.
#
# Missing tools: as root with apt-get (CI, Debian), installs `systemd` and `nginx`
# (--no-install-recommends); CHECK_DEPLOY_NO_INSTALL=1 turns that off (then SKIP).
set -euo pipefail
cd "$(dirname "$0")/.."

UNIT=deploy/limelight.service
TEMPLATE=deploy/limelight@.service
ENVEX=deploy/limelight.env.example
NGINX_CONF=deploy/nginx/limelight.conf
# LIMELIGHT_* variables in src/ that are not `serve` flags (so need no line in the env file).
NOT_FLAGS=" "
# Exposure ceiling for `systemd-analyze security` (its 0-100 scale; 25 is printed as 2.5).
SECURITY_THRESHOLD=25

errors=0
err() { echo "ERROR: $*" >&2; errors=$((errors + 1)); }
ok() { echo "ok    $*"; }
skip() { echo "SKIP: $*"; }
section() { echo; echo "== $*"; }

tmp=$(mktemp -d)
nginx_pid=
cleanup() {
    if [[ -n "$nginx_pid" ]]; then kill "$nginx_pid" 2>/dev/null || true; fi
    rm -rf "$tmp"
}
trap cleanup EXIT

# Last value of a key in a unit file (systemd: a later single-valued assignment wins).
unit_get() { sed -n "s/^$2=//p" "$1" | tail -n 1; }
# All lines "Key=value" of a unit, for exact membership tests.
unit_has() { grep -qxF -- "$2" "$1"; }
# systemd time span ("150s", "15min", "2min 30s", "90") to whole seconds.
timespan_s() {
    awk -v s="$1" 'BEGIN {
        n = split(s, t, /[ \t]+/); total = 0
        for (i = 1; i <= n; i++) {
            if (t[i] == "") continue
            if (!match(t[i], /^[0-9.]+/)) { print "bad"; exit }
            v = substr(t[i], 1, RLENGTH); u = substr(t[i], RLENGTH + 1)
            if (u == "" || u == "s" || u == "sec") f = 1
            else if (u == "min" || u == "m") f = 60
            else if (u == "h" || u == "hr") f = 3600
            else if (u == "ms" || u == "msec") f = 0.001
            else { print "bad"; exit }
            total += v * f
        }
        printf "%d\n", total }'
}
# nginx size ("16m", "512k", "1g", "1048576") to bytes.
nginx_size() {
    awk -v s="$1" 'BEGIN {
        u = tolower(substr(s, length(s))); v = s + 0
        if (u == "k") v *= 1024; else if (u == "m") v *= 1048576; else if (u == "g") v *= 1073741824
        printf "%d\n", v }'
}
env_get() { sed -n "s/^$1=//p" "$ENVEX" | tail -n 1; }

can_install() {
    [[ "${CHECK_DEPLOY_NO_INSTALL:-0}" != 1 && $(id -u) == 0 ]] && command -v apt-get >/dev/null
}
apt_updated=0
# apt_install PKG...: install without recommends; runs `apt-get update` once if needed. Keeps
# package scripts from starting services (nginx would take port 80) with a policy-rc.d.
apt_install() {
    local policy=/usr/sbin/policy-rc.d made_policy=0 start rc=0
    if [[ ! -e $policy ]]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && made_policy=1
    fi
    start=$(date +%s)
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" \
        >"$tmp/apt.log" 2>&1; then
        if [[ $apt_updated == 0 ]]; then
            apt_updated=1
            apt-get update -q >>"$tmp/apt.log" 2>&1 || true
            DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" \
                >>"$tmp/apt.log" 2>&1 || rc=$?
        else
            rc=1
        fi
    fi
    if [[ $made_policy == 1 ]]; then rm -f "$policy"; fi
    if [[ $rc != 0 ]]; then
        tail -n 20 "$tmp/apt.log" >&2
        return 1
    fi
    echo "      installed $* in $(($(date +%s) - start)) s"
}

# ------------------------------------------------------------------------------------------------
section "files"
for f in "$UNIT" "$TEMPLATE" "$ENVEX" "$NGINX_CONF" docs/operations.md; do
    if [[ -f $f ]]; then ok "$f"; else err "$f is missing"; fi
done
if ((errors)); then exit 1; fi

# ------------------------------------------------------------------------------------------------
section "consistency"

# Directives the design relies on (docs/operations.md explains each).
required=(
    "Type=notify" "NotifyAccess=main" "KillSignal=SIGTERM" "KillMode=mixed"
    "Restart=on-failure" "EnvironmentFile=-/etc/limelight/limelight.env"
    "DynamicUser=yes" "ProtectSystem=strict" "ProtectHome=yes" "PrivateTmp=yes"
    "NoNewPrivileges=yes" "PrivateDevices=no" "DevicePolicy=closed"
    "DeviceAllow=char-nvidia rw" "DeviceAllow=char-nvidiactl rw" "DeviceAllow=char-nvidia-uvm rw"
    "Environment=CUDA_DEVICE_ORDER=PCI_BUS_ID"
)
for u in "$UNIT" "$TEMPLATE"; do
    missing=0
    for d in "${required[@]}"; do
        if ! unit_has "$u" "$d"; then err "$u lacks '$d'"; missing=1; fi
    done
    exec_start=$(unit_get "$u" ExecStart)
    case "$exec_start" in
    "/usr/local/bin/limelight serve --model \${LIMELIGHT_MODEL}"*) ;;
    *) err "$u: ExecStart should run 'limelight serve --model \${LIMELIGHT_MODEL}', is '$exec_start'"; missing=1 ;;
    esac
    start_s=$(timespan_s "$(unit_get "$u" TimeoutStartSec)")
    if [[ $start_s == bad || $start_s -lt 300 ]]; then
        err "$u: TimeoutStartSec must allow minutes for ~40 GB of weights (>= 5min)"
        missing=1
    fi
    ((missing)) || ok "$u: required directives, ExecStart, TimeoutStartSec ${start_s}s"
done

t_ok=1
unit_has "$TEMPLATE" "Environment=CUDA_VISIBLE_DEVICES=%i" || { err "$TEMPLATE must pin CUDA_VISIBLE_DEVICES=%i"; t_ok=0; }
unit_has "$TEMPLATE" "EnvironmentFile=-/etc/limelight/limelight-%i.env" || { err "$TEMPLATE lacks the per-instance env file"; t_ok=0; }
unit_has "$TEMPLATE" "Conflicts=limelight.service" || { err "$TEMPLATE must conflict with limelight.service (same port and GPU as instance 0)"; t_ok=0; }
[[ $(unit_get "$TEMPLATE" ExecStart) == *" --port 808%i" ]] || { err "$TEMPLATE: ExecStart must end with --port 808%i"; t_ok=0; }
((t_ok == 0)) || ok "$TEMPLATE: GPU pinning, per-instance env file, port 808%i, Conflicts="

# From the time limits to the end, the two units must carry the same directives (comments may
# differ): the template is the single unit, instanced.
directives_after_limits() { sed -n '/^# --- Time limits/,$p' "$1" | grep -v -e '^#' -e '^$'; }
if diff <(directives_after_limits "$UNIT") <(directives_after_limits "$TEMPLATE") >"$tmp/units.diff"; then
    ok "limits, identity and sandbox directives are identical in both units"
else
    err "limits/identity/sandbox directives differ between $UNIT and $TEMPLATE:"
    cat "$tmp/units.diff" >&2
fi

# Env file syntax: systemd reads KEY=value lines; `export` or spaces around '=' are mistakes.
bad_lines=$(grep -nvE '^[[:space:]]*(#.*)?$|^[A-Za-z_][A-Za-z0-9_]*=' "$ENVEX" || true)
if [[ -n $bad_lines ]]; then err "$ENVEX: lines that are not KEY=value or comments:"$'\n'"$bad_lines"; else ok "$ENVEX: syntax"; fi
dups=$(grep -oE '^[A-Z_][A-Z0-9_]*=' "$ENVEX" | sort | uniq -d)
[[ -z $dups ]] || err "$ENVEX sets twice: $dups"

drain=$(env_get LIMELIGHT_DRAIN_TIMEOUT)
if [[ ! $drain =~ ^[0-9]+$ ]]; then
    err "$ENVEX must set LIMELIGHT_DRAIN_TIMEOUT (seconds) explicitly; it sizes TimeoutStopSec"
else
    for u in "$UNIT" "$TEMPLATE"; do
        stop_s=$(timespan_s "$(unit_get "$u" TimeoutStopSec)")
        if [[ $stop_s == bad || $stop_s -lt $((drain + 15)) ]]; then
            err "$u: TimeoutStopSec (${stop_s}s) must be >= LIMELIGHT_DRAIN_TIMEOUT ($drain s) + 15 s, or systemd SIGKILLs a draining server"
        else
            ok "$u: TimeoutStopSec ${stop_s}s >= drain ${drain}s + 15s"
        fi
    done
fi

max_body=$(env_get LIMELIGHT_MAX_BODY_BYTES)
ngx_body=$(sed -n 's/^[[:space:]]*client_max_body_size[[:space:]]\{1,\}\([0-9]\{1,\}[kKmMgG]\{0,1\}\);.*/\1/p' "$NGINX_CONF" | tail -n 1)
if [[ ! $max_body =~ ^[0-9]+$ ]]; then
    err "$ENVEX must set LIMELIGHT_MAX_BODY_BYTES explicitly; the nginx body limit follows it"
elif [[ -z $ngx_body ]]; then
    err "$NGINX_CONF has no client_max_body_size (nginx's default, 1m, would refuse large bodies)"
elif (($(nginx_size "$ngx_body") < max_body)); then
    err "$NGINX_CONF: client_max_body_size $ngx_body < LIMELIGHT_MAX_BODY_BYTES $max_body"
else
    ok "nginx client_max_body_size $ngx_body >= LIMELIGHT_MAX_BODY_BYTES $max_body"
fi

# nginx must drop an idle upstream connection before limelight closes it (its head timeout):
# otherwise a POST sent as the server closes the connection fails with 502.
ngx_keep=$(sed -n 's/^[[:space:]]*keepalive_timeout[[:space:]]\{1,\}\([0-9]\{1,\}\)s\{0,1\};.*/\1/p' "$NGINX_CONF" | head -n 1)
head_timeout=$(sed -n 's/.*env = "LIMELIGHT_HEADER_TIMEOUT", default_value_t = \([0-9]\{1,\}\).*/\1/p' src/cli.rs)
if [[ -z $ngx_keep || -z $head_timeout ]]; then
    err "could not read nginx's upstream keepalive_timeout (${ngx_keep:-none}) or --header-timeout's default (${head_timeout:-none})"
elif ((ngx_keep >= head_timeout)); then
    err "$NGINX_CONF: upstream keepalive_timeout ${ngx_keep}s >= limelight's header timeout ${head_timeout}s"
else
    ok "nginx upstream keepalive_timeout ${ngx_keep}s < limelight's header timeout ${head_timeout}s"
fi

n_ok=1
for d in "proxy_buffering off;" "proxy_http_version 1.1;" 'proxy_set_header Connection "";' "least_conn;"; do
    grep -qF -- "$d" "$NGINX_CONF" || { err "$NGINX_CONF lacks '$d'"; n_ok=0; }
done
bad_ports=$(grep -oE '^[[:space:]]*server[[:space:]]+[^;]*:[0-9]+' "$NGINX_CONF" | grep -vE '127\.0\.0\.1:808[0-9]$' || true)
[[ -z $bad_ports ]] || { err "$NGINX_CONF: upstream servers outside limelight@N's 127.0.0.1:808N: $bad_ports"; n_ok=0; }
((n_ok == 0)) || ok "$NGINX_CONF: streaming directives, upstream ports follow limelight@N"

# The env file documents every `serve` flag's variable, and only those. The flags are defined
# in src/ (clap `env = "LIMELIGHT_..."`); until the server lands there is nothing to compare.
example_keys=$( (grep -oE '^#?LIMELIGHT_[A-Z0-9_]+=' "$ENVEX" || true) | tr -d '#=' | sort -u)
src_keys=$( (grep -rhoE '"LIMELIGHT_[A-Z0-9_]+"' src 2>/dev/null || true) | tr -d '"' | sort -u)
for k in $NOT_FLAGS; do src_keys=$(grep -vx "$k" <<<"$src_keys" || true); done
if [[ -z $src_keys ]]; then
    skip "src/ defines no \"LIMELIGHT_*\" variables yet: env file keys not compared with the serve flags"
else
    extra=$(comm -23 <(echo "$example_keys") <(echo "$src_keys"))
    undocumented=$(comm -13 <(echo "$example_keys") <(echo "$src_keys"))
    [[ -z $extra ]] || err "$ENVEX names variables the binary does not read: $(tr '\n' ' ' <<<"$extra")"
    [[ -z $undocumented ]] || err "$ENVEX lacks (add a commented line, or list it in NOT_FLAGS): $(tr '\n' ' ' <<<"$undocumented")"
    [[ -n $extra || -n $undocumented ]] || ok "$ENVEX: keys match the LIMELIGHT_* variables in src/"
fi

# ------------------------------------------------------------------------------------------------
section "systemd"
if ! command -v systemd-analyze >/dev/null && can_install; then
    echo "      systemd-analyze missing: installing Debian package systemd"
    apt_install systemd || err "could not install systemd"
fi
if ! command -v systemd-analyze >/dev/null; then
    skip "systemd-analyze not found (install Debian package 'systemd'); units not verified"
else
    echo "      $(systemd-analyze --version | head -n 1)"
    # verify checks that ExecStart's binary exists and is executable, and --root= would need a
    # whole systemd tree; so verify copies whose /usr/local/bin/limelight points at a stub.
    # Everything else in the files is verified as written.
    mkdir -p "$tmp/units" "$tmp/bin"
    printf '#!/bin/sh\nexit 0\n' >"$tmp/bin/limelight"
    chmod +x "$tmp/bin/limelight"
    sed "s|/usr/local/bin/limelight|$tmp/bin/limelight|g" "$UNIT" >"$tmp/units/limelight.service"
    sed "s|/usr/local/bin/limelight|$tmp/bin/limelight|g" "$TEMPLATE" >"$tmp/units/limelight@.service"
    ln -s limelight@.service "$tmp/units/limelight@3.service"
    for name in limelight.service limelight@3.service; do
        rc=0
        SYSTEMD_LOG_COLOR=0 systemd-analyze verify "$tmp/units/$name" >"$tmp/verify.log" 2>&1 || rc=$?
        # verify exits 0 on "Unknown key" and "Invalid value ..., ignoring": any line about our
        # files is an error. Lines about other units (host's own configuration) are only shown.
        ours=$(grep -F "$tmp/units/" "$tmp/verify.log" || true)
        others=$(grep -vF "$tmp/units/" "$tmp/verify.log" || true)
        if [[ $rc != 0 || -n $ours ]]; then
            err "systemd-analyze verify $name (rc $rc):"$'\n'"$(sed "s|$tmp/units/|deploy/|g" "$tmp/verify.log")"
        else
            ok "systemd-analyze verify $name"
            [[ -z $others ]] || sed 's/^/      (host) /' <<<"$others"
        fi
    done
    if systemd-analyze security --help 2>/dev/null | grep -q -- '--offline'; then
        for name in limelight.service limelight@3.service; do
            rc=0
            systemd-analyze security --offline=true --threshold=$SECURITY_THRESHOLD \
                "$tmp/units/$name" >"$tmp/security.log" 2>&1 || rc=$?
            level=$(grep -o 'Overall exposure level for [^:]*: [0-9.]*' "$tmp/security.log" | awk '{print $NF}')
            if [[ $rc != 0 ]]; then
                err "systemd-analyze security $name: exposure ${level:-?} above $((SECURITY_THRESHOLD / 10)).$((SECURITY_THRESHOLD % 10)) (or it failed):"$'\n'"$(grep -F '✗' "$tmp/security.log" || tail -n 5 "$tmp/security.log")"
            else
                ok "systemd-analyze security $name: exposure $level (ceiling $((SECURITY_THRESHOLD / 10)).$((SECURITY_THRESHOLD % 10)))"
            fi
        done
    else
        skip "systemd-analyze security --offline needs systemd >= 250; exposure not scored"
    fi
fi

# ------------------------------------------------------------------------------------------------
section "nginx"
NGINX=$(command -v nginx || true)
[[ -n $NGINX || ! -x /usr/sbin/nginx ]] || NGINX=/usr/sbin/nginx
if [[ -z $NGINX ]] && can_install; then
    echo "      nginx missing: installing Debian package nginx"
    apt_install nginx || err "could not install nginx"
    NGINX=$(command -v nginx || echo /usr/sbin/nginx)
    [[ -x $NGINX ]] || NGINX=
fi
if [[ -z $NGINX ]]; then
    skip "nginx not found (install Debian package 'nginx'); nginx config not tested"
else
    echo "      $("$NGINX" -v 2>&1)"
    mkdir -p "$tmp/nginx/logs" "$tmp/nginx/temp"
    # Same config, with its log files in the scratch prefix (nginx -t opens them).
    sed "s|/var/log/nginx/|$tmp/nginx/logs/|g" "$NGINX_CONF" >"$tmp/nginx/limelight.conf"
    user_line=
    [[ $(id -u) != 0 ]] || user_line="user root;"
    # wrapper PREFIX CONF_TO_INCLUDE: a minimal nginx.conf with everything writable under PREFIX.
    wrapper() {
        cat <<EOF
$user_line
worker_processes 1;
pid $1/nginx.pid;
error_log $1/logs/error.log info;
events { worker_connections 256; }
http {
    access_log $1/logs/access.log;
    client_body_temp_path $1/temp/body;
    proxy_temp_path $1/temp/proxy;
    fastcgi_temp_path $1/temp/fastcgi;
    uwsgi_temp_path $1/temp/uwsgi;
    scgi_temp_path $1/temp/scgi;
    include $2;
}
EOF
    }
    wrapper "$tmp/nginx" "$tmp/nginx/limelight.conf" >"$tmp/nginx/nginx.conf"
    eflag=()
    if "$NGINX" -h 2>&1 | grep -q -- '-e filename'; then eflag=(-e "$tmp/nginx/logs/error.log"); fi
    nginx_t_ok=0
    if "$NGINX" -t -q "${eflag[@]}" -p "$tmp/nginx" -c "$tmp/nginx/nginx.conf" >"$tmp/nginx-t.log" 2>&1; then
        nginx_t_ok=1
        ok "nginx -t: $NGINX_CONF inside http {}"
        [[ ! -s $tmp/nginx-t.log ]] || sed 's/^/      /' "$tmp/nginx-t.log"
    else
        err "nginx -t on $NGINX_CONF:"$'\n'"$(sed "s|$tmp/nginx/|deploy/nginx/|g" "$tmp/nginx-t.log")"
    fi

    # --- smoke test ------------------------------------------------------------------------------
    PY=$(command -v python3 || true)
    if [[ -z $PY ]]; then
        skip "python3 not found: nginx streaming smoke test not run"
    elif [[ $nginx_t_ok == 0 ]]; then
        skip "nginx smoke test: nginx -t failed"
    else
        mkdir -p "$tmp/smoke/logs" "$tmp/smoke/temp"
        if "$PY" - "$NGINX" "$tmp/smoke" "$NGINX_CONF" "$max_body" "$user_line" "${#eflag[@]}" <<'PYEOF'; then
import http.server, os, re, socket, socketserver, subprocess, sys, threading, time

nginx, prefix, conf_path, max_body, user_line, use_e = sys.argv[1:7]
use_e = use_e != "0"
max_body = int(max_body)
failures = []


def check(cond, what):
    print(("ok    " if cond else "FAIL  ") + what, flush=True)
    if not cond:
        failures.append(what)


# First audio chunk of a stream: large enough that a buffering proxy holds part of it back.
FIRST = b"A" * 100000
FIRST_WIRE = len(b"%x\r\n" % len(FIRST)) + len(FIRST) + 2


class Stub:
    """An upstream instance: mode "503" answers like a draining server, "ok" streams audio."""

    def __init__(self, mode):
        self.mode, self.conns, self.requests = mode, 0, []
        stub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def setup(self):
                super().setup()
                stub.conns += 1

            def do_GET(self):
                self.route()

            def do_POST(self):
                self.route()

            def send_whole(self, status, body, extra=()):
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                for k, v in extra:
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)

            def route(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                stub.requests.append((self.path, self.request_version, {k.lower(): v for k, v in self.headers.items()}))
                if stub.mode == "503":
                    return self.send_whole(503, b'{"error":{"message":"draining"}}', [("Retry-After", "1")])
                if self.path in ("/ready", "/health"):
                    return self.send_whole(200, b'{"status":"ok"}')
                if self.path != "/v1/audio/speech":
                    return self.send_whole(404, b"{}")
                if len(body) > 4096:
                    return self.send_whole(200, b'{"received":%d}' % len(body))
                # A stream: the first chunk now, the second after a pause, then a trailer.
                self.send_response(200)
                self.send_header("Content-Type", "audio/pcm")
                self.send_header("Transfer-Encoding", "chunked")
                self.send_header("Trailer", "X-Finish-Reason")
                self.end_headers()
                self.wfile.write(b"%x\r\n" % len(FIRST) + FIRST + b"\r\n")
                self.wfile.flush()
                time.sleep(float(self.headers.get("X-Smoke-Pause") or 0))
                self.wfile.write(b"6\r\nAUDIO2\r\n0\r\nX-Finish-Reason: stop\r\n\r\n")
                self.wfile.flush()

        class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


draining, a, b = Stub("503"), Stub("ok"), Stub("ok")
stubs = [draining] + [a, b] * 4  # for 127.0.0.1:8080 .. 8087
probe = socket.socket()
probe.bind(("127.0.0.1", 0))
listen_port = probe.getsockname()[1]
probe.close()

conf = open(conf_path).read()
conf = conf.replace("/var/log/nginx/", prefix + "/logs/")
conf = re.sub(r"listen\s+\d+;", "listen 127.0.0.1:%d;" % listen_port, conf)
conf = re.sub(r"127\.0\.0\.1:808(\d)", lambda m: "127.0.0.1:%d" % stubs[int(m.group(1))].port, conf)
open(prefix + "/limelight.conf", "w").write(conf)
open(prefix + "/nginx.conf", "w").write(f"""{user_line}
worker_processes 1;
pid {prefix}/nginx.pid;
error_log {prefix}/logs/error.log info;
events {{ worker_connections 256; }}
http {{
    client_body_temp_path {prefix}/temp/body;
    proxy_temp_path {prefix}/temp/proxy;
    fastcgi_temp_path {prefix}/temp/fastcgi;
    uwsgi_temp_path {prefix}/temp/uwsgi;
    scgi_temp_path {prefix}/temp/scgi;
    include {prefix}/limelight.conf;
}}
""")
cmd = [nginx, "-p", prefix, "-c", prefix + "/nginx.conf", "-g", "daemon off;"]
if use_e:
    cmd[1:1] = ["-e", prefix + "/logs/error.log"]
proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
try:
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", listen_port), timeout=0.2).close()
            break
        except OSError:
            if proc.poll() is not None:
                sys.exit("nginx exited: " + proc.stderr.read().decode())
            time.sleep(0.05)

    def request(method, path, body=b"", headers=()):
        """Raw HTTP/1.1; returns status, headers (lower-case), raw body, the time by which the
        first audio chunk had fully arrived (None if never), and the total time."""
        s = socket.create_connection(("127.0.0.1", listen_port), timeout=10)
        head = f"{method} {path} HTTP/1.1\r\nHost: tts.test\r\nConnection: close\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers)
        if method == "POST":
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        t0 = time.monotonic()
        s.sendall(head.encode() + b"\r\n" + body)
        data, first_body = b"", None
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
            if first_body is None and b"\r\n\r\n" in data and len(data.split(b"\r\n\r\n", 1)[1]) >= FIRST_WIRE:
                first_body = time.monotonic() - t0
        s.close()
        head, _, raw = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        hdrs = {l.split(":", 1)[0].strip().lower(): l.split(":", 1)[1].strip() for l in lines[1:] if ":" in l}
        return status, hdrs, raw, first_body, time.monotonic() - t0

    speech = b'{"model":"drama-3","input":"Hello.","voice":"default"}'
    # 1. Streaming: the first audio chunk reaches the client before the upstream has finished.
    # (proxy_buffering on holds back the tail of the 100 kB chunk; gzip holds back everything.)
    slow = [("TE", "trailers"), ("Accept-Encoding", "gzip"), ("X-Smoke-Pause", "0.6")]
    status, hdrs, raw, first, total = request("POST", "/v1/audio/speech", speech, slow)
    check(status == 200, f"speech through nginx: 200 (got {status})")
    check(first is not None and first < 0.4 and total >= 0.55,
          f"streamed, not buffered: first 100 kB chunk complete after {first and round(first, 2)} s, end after {round(total, 2)} s (upstream pauses 0.6 s)")
    check(hdrs.get("transfer-encoding") == "chunked" and raw.endswith(b"0\r\n\r\n") and b"AUDIO2" in raw,
          "client gets a complete chunked body")
    check("trailer" not in hdrs, "no Trailer header announced (nginx cannot pass trailers)")
    # 2. Failover: the draining instance (503) is skipped; every request still succeeds.
    statuses = [status]
    while not [r for r in draining.requests if r[0] == "/v1/audio/speech"] and len(statuses) < 16:
        statuses.append(request("POST", "/v1/audio/speech", speech)[0])
    for _ in range(3):
        statuses.append(request("POST", "/v1/audio/speech", speech)[0])
    check(any(r[0] == "/v1/audio/speech" for r in draining.requests),
          "the draining instance was tried")
    check(all(s == 200 for s in statuses), f"503 from a draining instance fails over: {len(statuses)} speech requests, statuses {sorted(set(statuses))}")
    # 3. Upstream side: HTTP/1.1, keep-alive (no Connection: close), no TE.
    seen = a.requests + b.requests
    check(all(v == "HTTP/1.1" and h.get("connection", "").lower() != "close" for _, v, h in seen),
          "upstream requests are HTTP/1.1 without Connection: close")
    check(all("te" not in h for _, _, h in seen), "TE is not forwarded")
    check(a.conns + b.conns < len(seen), f"upstream connections reused: {a.conns + b.conns} connections for {len(seen)} requests")
    # 4. A body of exactly LIMELIGHT_MAX_BODY_BYTES reaches the server.
    status, _, raw, _, _ = request("POST", "/v1/audio/speech", b" " * max_body)
    check(status == 200 and b'"received":%d' % max_body in raw, f"a {max_body}-byte body reaches the upstream (got {status})")
    # 5. Pool readiness, metrics hidden, nginx's own health.
    check(request("GET", "/ready")[0] == 200, "/ready through the pool: 200 while one instance is draining")
    check(request("GET", "/metrics")[0] == 404, "/metrics is not exposed through the pool")
    check(request("GET", "/nginx-health")[0] == 200, "/nginx-health: 200")
finally:
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
if failures:
    print(open(prefix + "/logs/error.log").read()[-3000:], file=sys.stderr)
    sys.exit(1)
PYEOF
            :
        else
            err "nginx smoke test failed (see FAIL lines above)"
        fi
    fi
fi

# ------------------------------------------------------------------------------------------------
echo
if ((errors)); then
    echo "check-deploy: $errors error(s)" >&2
    exit 1
fi
echo "check-deploy: all checks passed"
