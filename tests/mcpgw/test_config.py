"""The gateway's config file refuses what would make two things read as one."""

from __future__ import annotations

from pathlib import Path

import pytest

from quorumgate.mcpgw.config import GatewayConfig, GatewayConfigError, load_gateway_config

HEAD = """
key_file = "agent.key"
[upstreams.files]
command = ["python3", "files_server.py"]
"""


def load(tmp_path: Path, body: str) -> GatewayConfig:
    path = tmp_path / "gateway.toml"
    path.write_text(HEAD + body)
    return load_gateway_config(path)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            '[tools.read_file]\ntool = "files.read"\n[tools.Read_File]\ntool = "files.other"\n',
            "tools.read_file: differs from tools.Read_File only by case",
        ),
        ('[tools."read file"]\ntool = "files.read"\n', "not an MCP tool name"),
        ('[tools."re\u0430d_file"]\ntool = "files.read"\n', "not an MCP tool name"),
        (
            '[tools.read]\ntool = "files.read"\n[tools.cat]\ntool = "files.read"\n',
            "tools.read: files.read is tools.cat's already",
        ),
        ('[resources.other]\ntool = "files.read"\n', "resources.other: no upstream"),
        ('[resources.files]\ntool = "files.read"\nuri = "x"\n', "resources.files: a table"),
        ('[resources.files]\ntool = "Not A Tool!"\n', "resources.files.tool: not"),
        (
            '[tools.read_file]\ntool = "files.read"\n[resources.files]\ntool = "files.read"\n',
            "resources.files.tool: files.read is tools.read_file's",
        ),
    ],
)
def test_a_config_that_could_confuse_two_things_is_refused(
    tmp_path: Path, body: str, message: str
) -> None:
    with pytest.raises(GatewayConfigError, match=message):
        load(tmp_path, body)


def test_a_config_with_tools_and_resources(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        '[tools.read_file]\ntool = "files.read"\ntarget = "path"\n'
        '[resources.files]\ntool = "files.resources"\n',
    )
    assert config.tools["read_file"].tool == "files.read"
    assert config.resources == {"files": "files.resources"}
