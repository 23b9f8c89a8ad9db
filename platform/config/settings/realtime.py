"""Django Channels: the channel layer that carries run updates to WebSocket consumers."""

from .environment import REDIS_URL

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {
            "hosts": [REDIS_URL],
            # Keys of the layer stay apart from the trainer's and producers' `tandem:run:*` keys.
            "prefix": "tandem:channels",
            # A slow browser tab drops updates after this many queued messages;
            # it backfills over REST, so dropping is safe.
            "capacity": 500,
        },
    },
}
