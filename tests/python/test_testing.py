"""start_node_daemon fails the test whose daemon went wrong even when the test did not notice:
a sanitizer report in the daemon's log, or a non-zero exit status when it was stopped. The
ASan/UBSan step of scripts/test.sh relies on this; a stand-in daemon plays each case here."""

import sys

import pytest

from mooncake.sparse import testing

# Listens on --socket_path like mooncake_sparse_node and, on SIGTERM, ends as $FAKE_DAEMON_END
# says: "clean", "report" (a sanitizer report on stderr, exit 0) or "status" (exit 1).
FAKE_DAEMON = """\
import os, signal, socket, sys
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
path = next(a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--socket_path="))
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.bind(path)
s.listen(8)
signal.sigwait({signal.SIGTERM})
os.unlink(path)
end = os.environ["FAKE_DAEMON_END"]
if end == "report":
    sys.stderr.write("==4242==ERROR: AddressSanitizer: heap-use-after-free on address 0x1\\n")
sys.exit(1 if end == "status" else 0)
"""


@pytest.fixture
def fake_daemon(tmp_path, monkeypatch):
    script = tmp_path / "fake_node"
    script.write_text(f"#!{sys.executable}\n" + FAKE_DAEMON)
    script.chmod(0o755)
    monkeypatch.setenv("MOONCAKE_SPARSE_NODE_BIN", str(script))

    def run(end, **kwargs):
        monkeypatch.setenv("FAKE_DAEMON_END", end)
        with testing.start_node_daemon(tmp_path / end, **kwargs) as daemon:
            assert daemon.binary == str(script)

    return run


def test_a_clean_exit_passes(fake_daemon):
    fake_daemon("clean")


def test_a_sanitizer_report_in_the_log_fails(fake_daemon):
    with pytest.raises(testing.DaemonFailure, match="(?s)sanitizer error.*AddressSanitizer"):
        fake_daemon("report")


def test_a_nonzero_exit_status_fails(fake_daemon):
    with pytest.raises(testing.DaemonFailure, match="exited with status 1"):
        fake_daemon("status")


def test_the_check_can_be_turned_off(fake_daemon):
    fake_daemon("status", check_clean=False)


def test_a_killed_daemon_is_not_a_failure(tmp_path, fake_daemon, monkeypatch):
    monkeypatch.setenv("FAKE_DAEMON_END", "status")
    with testing.start_node_daemon(tmp_path / "k") as daemon:
        daemon.kill()  # SIGKILL on purpose (as the restart tests do): no exit status to judge
    assert daemon.exit_codes == []
