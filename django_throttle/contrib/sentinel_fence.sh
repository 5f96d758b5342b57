#!/bin/sh
# Sentinel's client-reconfig-script for the fence of django-throttle's docs/deploying.md
# ("Counts across a failover"): min-replicas-to-write 1 on the primary alone.
#
# Sentinel runs it on each Sentinel after every failover, with
#   <master-name> <role> <state> <from-ip> <from-port> <to-ip> <to-port>
# It arms the new primary (to) once its replicas follow it, and disarms the old one (from)
# once it has become a replica: a replica still armed would refuse every write for as long as
# it has too few replicas of its own, if it is promoted later. Each step is idempotent, so
# every Sentinel may run it. Set in the Sentinel's environment, if needed:
# - DJANGO_THROTTLE_FENCE: the primary's min-replicas-to-write, its number of replicas (1);
# - DJANGO_THROTTLE_REDIS_CLI: for nodes that need AUTH or TLS, for example
#   "redis-cli --user fence --pass secret --tls".
set -u
cli=${DJANGO_THROTTLE_REDIS_CLI:-redis-cli}
replicas=${DJANGO_THROTTLE_FENCE:-1}
from_ip=$4 from_port=$5 to_ip=$6 to_port=$7

info() { $cli -h "$1" -p "$2" INFO replication 2>/dev/null | tr -d '\r'; }
fence() {
  $cli -h "$1" -p "$2" CONFIG SET min-replicas-to-write "$3" >/dev/null 2>&1 || return 1
  $cli -h "$1" -p "$2" CONFIG REWRITE >/dev/null 2>&1  # kept across a restart, if it has a file
  return 0
}

armed=no disarmed=no
# Sentinel kills a script after 60 s: every wait ends before.
for _ in $(seq 1 250); do
  online=$(info "$to_ip" "$to_port" | grep -c '^slave[0-9]*:.*state=online')
  if [ "$armed" = no ] && [ "$online" -ge "$replicas" ]; then
    fence "$to_ip" "$to_port" "$replicas" && armed=yes
  fi
  if [ "$disarmed" = no ] && info "$from_ip" "$from_port" | grep -q '^role:slave'; then
    fence "$from_ip" "$from_port" 0 && disarmed=yes
  fi
  [ "$armed" = yes ] && [ "$disarmed" = yes ] && exit 0
  sleep 0.2
done
[ "$armed" = yes ] || exit 1  # the old primary may be gone for good: only arming must happen
