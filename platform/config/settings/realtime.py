"""Django Channels: the channel layer that carries run updates to WebSocket consumers."""

from .env_vars import REDIS_URL

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {
            # redis-py 8 defaults socket_timeout to 5 s, which aborts the layer's
            # own 5 s blocking BZPOPMIN and tears every WebSocket down; give the
            # socket more time than the blocking pop.
            "hosts": [{"address": REDIS_URL, "socket_timeout": 30}],
            # Keys of the layer stay apart from the trainer's and producers' `tandem:run:*` keys.
            "prefix": "tandem:channels",
            # A slow browser tab drops updates after this many queued messages;
            # it backfills over REST, so dropping is safe.
            "capacity": 500,
        },
    },
}
