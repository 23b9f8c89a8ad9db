"""Settings split by concern; pick one of ``dev`` or ``test`` with DJANGO_SETTINGS_MODULE."""
