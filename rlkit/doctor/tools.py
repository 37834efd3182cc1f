"""The environment's tools, as the model will see them: for an environment whose tools come from elsewhere
(``env: {name: mcp}``), the server is started and asked here, so one that cannot start or does not serve the
tools the recipe names blocks the launch with one line, before any model loads."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlkit.doctor import Check, Context

F = "template"


def checks(ctx: Context) -> list[Check]:
    from rlkit.doctor import Check
    from rlkit.envs import env_class, recipe_tool_schemas
    from rlkit.errors import UserError

    env = ctx.recipe.env
    if env is None or not getattr(env_class(env.name), "dynamic_tools", False):
        return []
    try:
        names = [tool["function"]["name"] for tool in recipe_tool_schemas(ctx.recipe)]
    except UserError as e:
        return [Check(F, "env tools", "fail", str(e), "fix `env.server` / `env.tools`, or start the server")]
    if not names:
        return [Check(F, "env tools", "fail", f"the {env.name} server offers no tools", "point env.server at a "
                      "server with tools")]
    return [Check(F, "env tools", "ok", f"the {env.name} server answered: {len(names)} tools ({', '.join(names)})")]
