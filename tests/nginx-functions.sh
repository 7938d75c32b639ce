# SPDX-License-Identifier: BSD-3-Clause
# shellcheck shell=bash
# A real web server for the curl tests and bench/bench-http.sh: Debian's
# nginx, started as an ordinary process of the test (not the system's
# service), with its own configuration, pid file, logs and temporary
# files in a directory of the test, serving a directory on 127.0.0.1 at
# a free port.  nginx answers byte ranges (206) for static files.
#
#   start_nginx ROOT [DIR [WORKERS]]
#       serve ROOT; the server's files go in DIR (default ./nginx).
#       Sets NGINX_URL (http://127.0.0.1:PORT) and NGINX_ACCESS_LOG (one
#       line per request: method, path, status, Range header, bytes
#       sent).  With the reason in NGINX_SKIP: 1 when nginx is not
#       installed, 2 when it does not start.
#   start_test_nginx ROOT [DIR [WORKERS]]
#       start_nginx for a test (functions.sh sourced): 1 only when nginx
#       is not installed (a skip); an nginx that does not start fails
#       the test.
#   stop_nginx
#       stop it (also done at exit when the test has functions.sh's
#       cleanup).
#
# nginx rewrites its own environment when it names its processes, so
# functions.sh's cleanup could not tell it from a reused pid: it runs
# under a small shell (a new process, so that its environment shows the
# test's tag), which the cleanup does recognise, and which stops nginx
# when it is signalled.

start_nginx ()
{
    local root=$1 dir=${2:-$PWD/nginx} workers=${3:-1}
    NGINX_SKIP=
    local nginx
    nginx=$(PATH=$PATH:/usr/sbin:/sbin command -v nginx) ||
        { NGINX_SKIP="nginx is not installed (package nginx)"; return 1; }
    root=$(cd "$root" && pwd)
    mkdir -p "$dir/tmp"
    dir=$(cd "$dir" && pwd)
    # Its workers run as this user: as root, nginx would otherwise hand
    # them to nobody, who cannot read the test's directory.
    local user=
    [ "$(id -u)" = 0 ] && user="user $(id -un) $(id -gn);"
    local attempt port
    for attempt in 1 2 3 4 5; do
        port=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
        cat > "$dir/nginx.conf" <<EOF
daemon off;
master_process on;
worker_processes $workers;
$user
pid $dir/nginx.pid;
error_log $dir/error.log warn;
events { worker_connections 256; }
http {
    default_type application/octet-stream;
    sendfile on;
    keepalive_requests 100000;
    log_format ranges '\$request_method \$uri \$status range=\$http_range sent=\$body_bytes_sent';
    access_log $dir/access.log ranges;
    client_body_temp_path $dir/tmp/client;
    proxy_temp_path $dir/tmp/proxy;
    fastcgi_temp_path $dir/tmp/fastcgi;
    uwsgi_temp_path $dir/tmp/uwsgi;
    scgi_temp_path $dir/tmp/scgi;
    server {
        listen 127.0.0.1:$port;
        root $root;
    }
}
EOF
        rm -f "$dir/nginx.pid" "$dir/access.log" "$dir/error.log"
        # shellcheck disable=SC2016
        bash -c 'server=
                 trap "[ -z \"\$server\" ] || kill -TERM \$server 2> /dev/null; wait" TERM
                 "$@" < /dev/null &
                 server=$!
                 wait $server' nginx-shell \
             "$nginx" -p "$dir" -c "$dir/nginx.conf" -e "$dir/error.log" &
        NGINX_SHELL=$!
        _pids+=("$NGINX_SHELL")
        local i
        for i in $(seq 100); do
            if (exec 3<> "/dev/tcp/127.0.0.1/$port") 2> /dev/null; then
                NGINX_URL=http://127.0.0.1:$port
                NGINX_ACCESS_LOG=$dir/access.log
                return 0
            fi
            kill -0 "$NGINX_SHELL" 2> /dev/null || break
            sleep 0.1
        done
        stop_nginx
        # Another process took the port between the probe and nginx: try
        # another one.
        grep -q 'Address already in use' "$dir/error.log" 2> /dev/null || break
    done
    NGINX_SKIP="nginx did not start: $(tail -n 3 "$dir/error.log" 2> /dev/null | tr '\n' ' ')"
    return 2
}

start_test_nginx ()
{
    local status=0
    start_nginx "$@" || status=$?
    [ "$status" != 2 ] || fail "$NGINX_SKIP"
    return "$status"
}

stop_nginx ()
{
    [ -n "${NGINX_SHELL:-}" ] || return 0
    kill -TERM "$NGINX_SHELL" 2> /dev/null || true
    wait "$NGINX_SHELL" 2> /dev/null || true
    NGINX_SHELL=
}
