"""Default modes of injection points: each follows its name, `enable` without a mode uses it, `--list` shows it."""
from __future__ import annotations

import io
import re
import threading

import grpc
import pytest
from rich.console import Console

from common.injection import FAIL, KNOWN_POINTS, MODES, PAUSE, InjectedFailure, Injections, default_mode
from node.admin_service import AdminDeps, AdminService
from vbc.cli.admin import enabled_mode
from vbc.cli.parser import build_parser
from vbc.client import INJECT_ACTIONS, inject_response_to_dict
from vbc.render import injection_point_rows, injection_points_table
from vbcpb import vbc_pb2 as pb

PAUSE_POINTS = ("pause_tablet_migration_stage", "worker_pause_build_range", "worker_pause_process_staging",
                "worker_pause_before_finish",
                "worker_pause_after_chunk",
                "coordinator_pause_main_loop")


@pytest.mark.parametrize("name", sorted(KNOWN_POINTS))
def test_every_point_has_a_description_and_a_known_default_mode(name):
    assert KNOWN_POINTS[name].description and KNOWN_POINTS[name].default_mode in MODES


@pytest.mark.parametrize("name", sorted(KNOWN_POINTS))
def test_the_default_mode_follows_the_name(name):
    if "pause" in name:
        assert default_mode(name) == PAUSE
    elif "fail" in name:
        assert default_mode(name) == FAIL


def test_the_named_pause_points_and_the_scan_default_to_pause():
    assert {name: default_mode(name) for name in (*PAUSE_POINTS, "read.replica.scan")} == dict.fromkeys(
        (*PAUSE_POINTS, "read.replica.scan"), PAUSE)
    assert default_mode("worker_fail_build_range") == default_mode("stream_tablet_fail") == FAIL
    assert default_mode("no.such.point") == ""


def test_points_start_disabled_in_their_default_mode():
    points = Injections().points()
    assert not any(p.enabled for p in points.values())
    assert {name: p.mode for name, p in points.items()} == {name: s.default_mode for name, s in KNOWN_POINTS.items()}


@pytest.mark.parametrize("mode", [None, ""])
@pytest.mark.parametrize("name", sorted(KNOWN_POINTS))
def test_enable_without_a_mode_uses_the_default(name, mode):
    injections = Injections()
    injections.enable(name, mode)
    point = injections.points()[name]
    assert point.enabled and point.mode == default_mode(name)


def test_an_explicit_mode_overrides_the_default():
    injections = Injections()
    injections.enable("pause_tablet_migration_stage", mode=FAIL)
    injections.enable("worker_fail_build_range", mode=PAUSE)
    points = injections.points()
    assert points["pause_tablet_migration_stage"].mode == FAIL and points["worker_fail_build_range"].mode == PAUSE
    with pytest.raises(InjectedFailure, match="pause_tablet_migration_stage"):
        injections.hit("pause_tablet_migration_stage")


def test_a_default_pause_point_pauses_and_a_default_fail_point_fails():
    injections = Injections()
    injections.enable("worker_fail_build_range")
    with pytest.raises(InjectedFailure, match="injected failure at 'worker_fail_build_range'"):
        injections.hit("worker_fail_build_range")
    injections.enable("pause_tablet_migration_stage")
    passed = threading.Event()
    thread = threading.Thread(target=lambda: (injections.hit("pause_tablet_migration_stage"), passed.set()))
    thread.start()
    assert injections.wait_hit("pause_tablet_migration_stage", timeout=5)
    assert not passed.wait(0.1), "a pause point must hold the thread until disabled"
    injections.disable("pause_tablet_migration_stage")
    assert passed.wait(5)
    thread.join(5)


def test_an_unknown_mode_is_refused_with_the_choices_and_the_default():
    injections = Injections()
    with pytest.raises(ValueError, match=r"unknown injection mode 'explode' for 'read.replica.scan'; use 'fail' or "
                                         r"'pause' \(or none: the point's default, 'pause'\)"):
        injections.enable("read.replica.scan", "explode")
    assert not injections.points()["read.replica.scan"].enabled


def test_an_unknown_point_is_refused_before_its_mode_is_checked():
    with pytest.raises(KeyError, match="unknown injection point 'no.such.point'"):
        Injections().enable("no.such.point", "explode")


LISTED = {"node": "n1", "injections_enabled": True, "hit": False, "points": [
    {"name": "read.replica.scan", "enabled": True, "mode": FAIL, "one_shot": True, "hits": 2},
    {"name": "worker_pause_build_range", "enabled": False, "mode": PAUSE, "one_shot": False, "hits": 0},
    {"name": "from.a.newer.node", "enabled": False, "mode": FAIL, "one_shot": False, "hits": 0}]}


def test_listed_rows_carry_the_default_mode_known_to_the_client():
    assert [(p["name"], p["mode"], p["default_mode"]) for p in injection_point_rows(LISTED)] == [
        ("read.replica.scan", FAIL, PAUSE), ("worker_pause_build_range", PAUSE, PAUSE), ("from.a.newer.node", FAIL, "")]


def test_the_list_table_has_a_default_mode_column():
    console = Console(file=io.StringIO(), width=200, record=True)
    console.print(injection_points_table(LISTED))
    rows = [re.findall(r"[\w.]+", line) for line in console.export_text().splitlines()]
    assert ["name", "enabled", "mode", "default_mode", "one_shot", "hits"] in rows
    assert ["read.replica.scan", "true", "fail", "pause", "true", "2"] in rows
    assert ["from.a.newer.node", "false", "fail", "false", "0"] in rows  # no default known to this client


def test_the_mode_help_says_the_default_follows_the_point(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["inject", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "default: the point's own mode, which follows its name" in help_text and "fail (default)" not in help_text
    assert build_parser().parse_args(["inject", "p", "--enable"]).mode is None


@pytest.mark.parametrize("asked, listed, shown",
                         [(None, PAUSE, PAUSE), (FAIL, FAIL, FAIL), (None, "", "the point's default")])
def test_the_enable_line_names_the_mode_the_node_reports(asked, listed, shown):
    result = {"points": [{"name": "p", "mode": listed}, {"name": "other", "mode": FAIL}]}
    assert enabled_mode(result, "p", asked) == shown


class AbortingContext:
    """The part of a gRPC servicer context that `unary` uses: abort raises with the status."""

    def abort(self, code, details):
        raise RuntimeError(code, details)


@pytest.fixture
def admin():
    """An Admin servicer called directly (no server), on a node started with --enable-injections."""
    service = AdminService(AdminDeps(node_id="n1", read_state=None, raft_status=dict, require_ready=lambda: None,
                                     probe=lambda _: None, injections=Injections(), catch_up=lambda: None,
                                     check_view=None, clock=lambda: 0.0, injections_enabled=True))
    yield service
    service.close()


def inject(admin, name: str, action: str, mode: str = "") -> dict:
    request = pb.InjectRequest(name=name, action=INJECT_ACTIONS[action], mode=mode)
    return {p["name"]: p for p in inject_response_to_dict(admin.Inject(request, AbortingContext()))["points"]}


def test_admin_inject_with_no_mode_enables_the_points_default(admin):
    assert inject(admin, "pause_tablet_migration_stage", "enable")["pause_tablet_migration_stage"]["mode"] == PAUSE
    assert inject(admin, "worker_fail_build_range", "enable")["worker_fail_build_range"]["mode"] == FAIL


def test_admin_lists_a_disabled_point_in_its_default_mode(admin):
    inject(admin, "read.replica.scan", "enable", mode=FAIL)
    listed = inject(admin, "read.replica.scan", "disable")
    assert {name: p["mode"] for name, p in listed.items()} == {n: s.default_mode for n, s in KNOWN_POINTS.items()}


def test_admin_refuses_an_unknown_mode_as_invalid_argument(admin):
    with pytest.raises(RuntimeError) as refused:
        inject(admin, "read.replica.scan", "enable", mode="explode")
    code, details = refused.value.args
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "unknown injection mode" in details
