"""Live metrics of a project's runs over a WebSocket: what the workspace and reports redraw from."""

from channels.db import database_sync_to_async

from runs.consumers import FORBIDDEN_CLOSE_CODE, RunConsumer

from .realtime import project_group_name
from .selectors import project_is_visible_to_user_id


class ProjectConsumer(RunConsumer):
    """Forwards the ``metrics`` messages of every run of the project to a member's browser.

    A notifier, never the record: a page that was away reads the series again over REST. Access is
    checked as a run's socket checks it (RunConsumer), against the project's membership.
    """

    async def connect(self):
        project_id = self.scope["url_route"]["kwargs"]["project_id"]
        user = self.scope.get("user")
        if user is None or not user.is_authenticated or not await database_sync_to_async(
                project_is_visible_to_user_id)(user_id=user.pk, project_id=project_id):
            await self.close(code=FORBIDDEN_CLOSE_CODE)
            return
        self.project_id = project_id
        await self._join(user, project_group_name(project_id))

    def _still_visible(self) -> bool:
        return project_is_visible_to_user_id(user_id=self.user_id, project_id=self.project_id)
