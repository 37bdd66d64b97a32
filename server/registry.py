"""The configured agents and their backends, built once at start-up.

The backend contract (`server/agents.py`) never imports a backend; this module picks
each agent's backend by its configured name.
"""

from __future__ import annotations

from server.agents import Backend, EchoBackend, PythonBackend
from server.config import AgentConfig


def build_backend(agent: AgentConfig) -> Backend:
    if agent.backend == "upstream":
        from server.upstream import UpstreamBackend

        return UpstreamBackend(agent)
    if agent.backend == "python":
        return PythonBackend(agent.callable)
    if agent.backend == "a2a-sdk":
        from server.sdk_backend import SdkBackend

        return SdkBackend(agent)
    return EchoBackend()


class AgentRegistry:
    """The configured agents and one backend instance each, built at start-up."""

    def __init__(self, agents: dict[str, AgentConfig]) -> None:
        self.configs = agents
        self.backends: dict[str, Backend] = {name: build_backend(a) for name, a in agents.items()}

    def get(self, name: str) -> AgentConfig | None:
        return self.configs.get(name)

    def backend(self, name: str) -> Backend:
        return self.backends[name]

    def deadline_seconds(self, name: str) -> float:
        """How long one run of this agent may take before its task fails, uncharged."""
        return self.configs[name].deadline_seconds

    async def aclose(self) -> None:
        for backend in self.backends.values():
            await backend.aclose()
