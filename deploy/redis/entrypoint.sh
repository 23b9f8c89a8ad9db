#!/bin/sh
# The redis service's entrypoint (docker-compose.yml): writes the ACL file from the environment,
# then starts the image's own entrypoint with it. The file lives on a tmpfs, written anew at
# each start, so rotating a role's password is changing it in .env and restarting Redis.
set -eu

acl_file=/run/tandem-redis/users.acl
sh "$(dirname "$0")/write-acl.sh" "$acl_file"
# The image's entrypoint drops from root to the redis user, who must read the file.
if [ "$(id -u)" = 0 ]; then
    chown -R redis:redis "$(dirname "$acl_file")"
fi
# redis-server has no use for the passwords once they are hashed into the file.
unset REDIS_PASSWORD REDIS_PLATFORM_PASSWORD REDIS_WORKER_PASSWORD REDIS_TRAINER_PASSWORD
exec docker-entrypoint.sh "$@" --aclfile "$acl_file"
