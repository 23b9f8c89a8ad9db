"""The run log API's query parameters and lines."""

from rest_framework import serializers

from tandem.contracts import RUN_LOG_LEVELS, run_log_level_name

#: Lines a page holds at most, and by default.
MAX_LINES_PER_PAGE = 1000
DEFAULT_LINES_PER_PAGE = 200
#: Loggers one query may hide.
MAX_HIDDEN_LOGGERS = 50


class RunLogQuerySerializer(serializers.Serializer):
    after = serializers.IntegerField(
        required=False, min_value=0, help_text="Cursor: the lines after this line id, oldest first.")
    before = serializers.IntegerField(
        required=False, min_value=0, help_text="Without `after`: the newest lines before this id (scrolling back).")
    limit = serializers.IntegerField(
        required=False, min_value=1, max_value=MAX_LINES_PER_PAGE, default=DEFAULT_LINES_PER_PAGE,
        help_text="Lines per page.")
    level = serializers.ChoiceField(
        required=False, choices=[*RUN_LOG_LEVELS, *(name.lower() for name in RUN_LOG_LEVELS)],
        help_text="The lowest level shown: `warning` shows warnings, errors and critical lines.")
    process = serializers.CharField(
        required=False, max_length=300,
        help_text="A role (`trainer`, `rollout_worker`) or one process, `hostname:pid`.")
    q = serializers.CharField(
        required=False, max_length=200, trim_whitespace=False,
        help_text="Text the message, traceback or logger name contains (case-insensitive).")
    hide = serializers.ListField(
        required=False, max_length=MAX_HIDDEN_LOGGERS, child=serializers.CharField(max_length=255),
        help_text="Loggers to leave out, with their children (`hide=absl` hides `absl` and `absl.x`); repeat "
        "the parameter for more.")


class RunLogLoggerSerializer(serializers.Serializer):
    logger = serializers.CharField()
    lines = serializers.IntegerField(help_text="Of the run's kept lines.")


class RunLogLineSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    logged_at = serializers.DateTimeField(help_text="By the logging process's clock.")
    level = serializers.SerializerMethodField()
    role = serializers.CharField()
    hostname = serializers.CharField()
    pid = serializers.IntegerField()
    logger = serializers.CharField()
    message = serializers.CharField()
    traceback = serializers.CharField(help_text="Empty unless the line logged an exception.")

    def get_level(self, line) -> str:
        return run_log_level_name(line.level)


class RunLogPageSerializer(serializers.Serializer):
    run = serializers.IntegerField()
    lines = RunLogLineSerializer(many=True, help_text="Oldest first.")
    next_after = serializers.IntegerField(
        allow_null=True, help_text="Ask again with ?after= this for newer lines; null when there is no line yet.")
    has_more = serializers.BooleanField(
        help_text="More lines match in the page's direction: after it with `after`, else before it.")
    lines_kept = serializers.IntegerField(help_text="Lines of the run the platform keeps (any filter aside).")
    lines_deleted = serializers.IntegerField(
        help_text="The run's oldest lines deleted to keep it under the operator's cap (TANDEM_RUN_LOG_LINES_MAX).")
    lines_lost = serializers.IntegerField(
        help_text="Lines Redis trimmed from the run's bounded stream before the platform could store them.")
