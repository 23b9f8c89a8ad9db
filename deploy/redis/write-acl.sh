#!/bin/sh
# Writes Redis's ACL file (one user per Tandem role) from passwords in the environment.
#
# Usage: write-acl.sh PATH. Reads REDIS_PASSWORD (the operator's `admin` user, which no Tandem
# service uses), REDIS_PLATFORM_PASSWORD (web and platform-worker), REDIS_WORKER_PASSWORD and
# REDIS_TRAINER_PASSWORD. The file holds SHA-256 hashes, never a password, and the passwords never
# reach redis-server's argv (readable by anyone who can list the container's processes).
set -eu

out=$1

hash_of() {
    # ${#value}: a short password is refused here rather than guessed later.
    eval "value=\${$1:-}"
    if [ "${#value}" -lt 16 ]; then
        echo "write-acl.sh: set $1 (16 characters at least)" >&2
        exit 1
    fi
    printf '%s' "$value" | sha256sum | cut -d' ' -f1
}

admin=$(hash_of REDIS_PASSWORD)
platform=$(hash_of REDIS_PLATFORM_PASSWORD)
worker=$(hash_of REDIS_WORKER_PASSWORD)
trainer=$(hash_of REDIS_TRAINER_PASSWORD)

# Celery's keys (kombu's Redis transport): the queues (priority steps add a suffix to the name),
# kombu's own keys (_kombu.*: the exchanges' bindings and their deadlines), the unacknowledged-message hash, index and mutex, the workers'
# remote-control and reply queues (*.pidbox) and the event queues (celeryev.*).
celery_keys='~rollouts* ~probes* ~evaluations* ~exports* ~platform* ~_kombu.* ~unacked* ~*.pidbox ~celeryev*'
# Tandem's keys other than the platform's own cache and Channels layer (tandem/contracts/keys.py).
run_keys='~tandem:run:* ~tandem:rollout_task:* ~tandem:processes ~tandem:probe:* ~tandem:environment_version:* ~tandem:environment:*'
# Environments' secret settings (tandem:secrets:*) go to the platform, which writes them, and the
# workers, whose producers and probes build the environments; never to the trainer.
# Every application user: no command that wipes, reconfigures or inspects the whole server
# (FLUSHALL, FLUSHDB, CONFIG, DEBUG, SHUTDOWN, KEYS, INFO, MONITOR, MODULE, ACL, SAVE ...: the
# @dangerous category). Channels are all allowed: Celery's broadcast and event channels are named
# per database and pattern-subscribed, and carry no stored data.
commands='+@all -@dangerous allchannels'

umask 077
mkdir -p "$(dirname "$out")"
cat > "$out" <<ACL
user default off resetkeys resetchannels -@all
user admin on #$admin allkeys allchannels +@all
user tandem-platform on #$platform resetkeys ~tandem:* $celery_keys $commands
user tandem-worker on #$worker resetkeys $run_keys ~tandem:secrets:* $celery_keys $commands
user tandem-trainer on #$trainer resetkeys $run_keys $celery_keys $commands
ACL
