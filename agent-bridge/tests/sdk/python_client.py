"""An independent MCP client: the official Python SDK (`pip install mcp`)
drives agent-bridge over stdio and Streamable HTTP and checks exact bytes.

usage: python_client.py BRIDGE_BINARY
Exits non-zero (with the failed check) on any mismatch.
"""

import asyncio
import base64
import hashlib
import os
import re
import subprocess
import sys
import tempfile

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

BRIDGE = sys.argv[1]
PROBE_ARGS = ["--no-probe"]


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def payload_bytes(p: dict) -> bytes:
    data = p["text"].encode() if "text" in p else base64.b64decode(p["base64"])
    assert p["sha256"] == sha(data), f"payload sha256 does not match: {p}"
    return data


def blob_of(result) -> bytes:
    for c in result.content:
        if c.type == "resource" and hasattr(c.resource, "blob"):
            return base64.b64decode(c.resource.blob)
    raise AssertionError(f"no blob in {result.content}")


async def exercise(session: ClientSession, label: str) -> None:
    init = session.initialize_result if hasattr(session, "initialize_result") else None
    tools = {t.name for t in (await session.list_tools()).tools}
    for name in ["exec", "run_code", "write_file", "read_file", "list_dir", "stat",
                 "start_process", "poll_process", "write_stdin", "kill_process",
                 "kernel_evidence", "record_result"]:
        assert name in tools, f"{label}: tool {name} missing"

    cases = {
        "empty": b"",
        "nul-only": b"\0" * 1024,
        "invalid-utf8": b"\xff\xfe\xc3\x28 \x80\x00",
        "binary-2mib": os.urandom(2 << 20),
    }
    tmp = tempfile.mkdtemp(prefix="sdk-client-")
    for name, data in cases.items():
        path = f"{tmp}/{name}"
        w = await session.call_tool("write_file", {"path": path, "content_base64": base64.b64encode(data).decode(), "sha256": sha(data)})
        assert not w.is_error, f"{label} {name}: write failed: {w.content}"
        assert w.structured_content["sha256"] == sha(data)
        r = await session.call_tool("read_file", {"path": path})
        assert not r.is_error, f"{label} {name}: read failed: {r.content}"
        back = blob_of(r)
        assert back == data, f"{label} {name}: {len(back)} bytes back, {len(data)} sent"
        assert r.structured_content["sha256"] == sha(data)
        os.remove(path)
    os.rmdir(tmp)

    r = await session.call_tool("exec", {"command": "printf 'a\\000b\\377'; exit 7"})
    s = r.structured_content
    assert s["exit_code"] == 7, s
    assert s["stdout"]["has_nul"] is True and "text" not in s["stdout"], s
    assert payload_bytes(s["stdout"]) == b"a\0b\xff"
    assert "available" in s["kernel"], s

    r = await session.call_tool("exec", {"argv": ["echo", "a\0b"]})
    assert r.is_error and r.structured_content["error"]["argument"] == "argv[1]", r

    r = await session.call_tool("exec", {"argv": ["true"], "timeout_ms": "soon"})
    assert r.is_error and r.structured_content["error"]["argument"] == "timeout_ms", r

    try:
        r = await session.call_tool("no_such_tool", {})
        assert r.is_error, f"{label}: an unknown tool must be an error: {r}"
    except Exception as e:  # a JSON-RPC error is also right
        assert "unknown tool" in str(e), e
    print(f"python SDK over {label}: {len(cases)} round trips, exec bytes, argument errors: ok")


async def over_stdio() -> None:
    params = StdioServerParameters(command=BRIDGE, args=["serve", "--stdio", *PROBE_ARGS])
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            print(f"stdio: negotiated protocol {init.protocol_version}, server {init.server_info.name}")
            await exercise(session, "stdio")


async def over_http() -> None:
    proc = subprocess.Popen([BRIDGE, "serve", "--http", "127.0.0.1:0", *PROBE_ARGS],
                            stderr=subprocess.PIPE, text=True)
    try:
        url = None
        for line in proc.stderr:
            m = re.search(r"serving MCP at (\S+)", line)
            if m:
                url = m.group(1)
                break
        assert url, "the bridge did not report its URL"
        async with streamable_http_client(url, max_sse_event_size=256 << 20) as streams:
            read, write = streams[0], streams[1]
            async with ClientSession(read, write) as session:
                init = await session.initialize()
                print(f"http: negotiated protocol {init.protocol_version}")
                await exercise(session, "http")
    finally:
        proc.terminate()
        proc.wait(timeout=10)


async def main() -> None:
    await over_stdio()
    await over_http()


asyncio.run(main())
