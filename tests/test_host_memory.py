"""The memory a fused group may take on a CPU (``fusion/host_memory.py``): the host's
``MemAvailable``, or less where the process's memory cgroup (v2 or v1, or an ancestor) sets a
limit. The files are laid out as the kernel's documentation (cgroup-v2.rst, cgroup-v1
memory.rst) and this machine show them; the last test reads this machine's own."""

from __future__ import annotations

from pathlib import Path

from furcate_hydra.fusion.host_memory import (
    available_bytes,
    peak_resident_bytes,
    resident_bytes,
    restart_peak,
)

GIB = 1 << 30


def host(tmp_path: Path, cgroup_lines: str, available_gib: int = 64) -> tuple[Path, Path]:
    """A /proc with meminfo and self/cgroup, and an empty cgroup mount."""
    proc, cgroups = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "self").mkdir(parents=True)
    kib = available_gib * GIB // 1024
    (proc / "meminfo").write_text(f"MemTotal:       134217728 kB\nMemAvailable:   {kib} kB\n")
    (proc / "self" / "cgroup").write_text(cgroup_lines)
    cgroups.mkdir()
    return proc, cgroups


def group(folder: Path, files: dict[str, str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)


def test_without_a_memory_limit_it_is_what_the_host_has_available(tmp_path: Path) -> None:
    proc, cgroups = host(tmp_path, "0::/user.slice/session-1.scope\n")
    group(
        cgroups / "user.slice" / "session-1.scope",
        {"memory.max": "max\n", "memory.current": "4096\n"},
    )
    assert available_bytes(proc, cgroups) == 64 * GIB


def test_a_slurm_steps_v2_limit_bounds_it_less_the_cache_the_kernel_can_drop(
    tmp_path: Path,
) -> None:
    step = "/system.slice/slurmstepd.scope/job_7/step_0/user/task_0"
    proc, cgroups = host(tmp_path, f"0::{step}\n")
    group(cgroups / step.strip("/"), {"memory.max": "max\n", "memory.current": f"{GIB}\n"})
    # the job's allocation (8 GiB) is set on an ancestor: 3 GiB used, 1 GiB of it droppable cache
    group(
        cgroups / "system.slice" / "slurmstepd.scope" / "job_7",
        {
            "memory.max": f"{8 * GIB}\n",
            "memory.current": f"{3 * GIB}\n",
            "memory.stat": f"anon {2 * GIB}\nfile {GIB}\ninactive_file {GIB}\nactive_file 0\n",
        },
    )
    assert available_bytes(proc, cgroups) == 6 * GIB


def test_a_containers_v1_limit_bounds_it_where_its_cgroup_is_the_mounts_root(
    tmp_path: Path,
) -> None:
    # /proc/self/cgroup names the host's path; the container sees its own cgroup as the root
    proc, cgroups = host(tmp_path, "4:memory:/docker/3f2a\n1:cpu,cpuacct:/docker/3f2a\n0::/\n")
    group(
        cgroups / "memory",
        {
            "memory.limit_in_bytes": f"{2 * GIB}\n",
            "memory.usage_in_bytes": f"{GIB // 2}\n",
            "memory.stat": "cache 0\ntotal_inactive_file 0\n",
        },
    )
    assert available_bytes(proc, cgroups) == 3 * GIB // 2


def test_an_unlimited_v1_group_and_unreadable_files_leave_the_hosts_figure(tmp_path: Path) -> None:
    proc, cgroups = host(tmp_path, "4:memory:/process_api/ab\nnot a cgroup line\n", 12)
    group(
        cgroups / "memory" / "process_api" / "ab",
        {"memory.limit_in_bytes": "9223372036854771712\n", "memory.usage_in_bytes": "oops\n"},
    )
    assert available_bytes(proc, cgroups) == 12 * GIB


def test_a_limit_already_used_up_leaves_nothing(tmp_path: Path) -> None:
    proc, cgroups = host(tmp_path, "0::/\n")
    group(cgroups, {"memory.max": f"{GIB}\n", "memory.current": f"{GIB + 4096}\n"})
    assert available_bytes(proc, cgroups) == 0


def test_nothing_readable_is_unknown(tmp_path: Path) -> None:
    assert available_bytes(tmp_path / "no-proc", tmp_path / "no-cgroup") is None


def test_on_this_machine_it_is_at_most_what_the_host_has_available() -> None:
    meminfo = Path("/proc/meminfo").read_text()
    (line,) = [row for row in meminfo.splitlines() if row.startswith("MemAvailable:")]
    here = available_bytes()
    # MemAvailable moves between the two reads: within 256 MiB of it, or a cgroup's less
    assert here is not None and 0 < here <= int(line.split()[1]) * 1024 + (256 << 20)


def test_the_resident_size_and_its_peak_are_read_from_the_process_status(tmp_path: Path) -> None:
    proc, _ = host(tmp_path, "0::/\n")
    (proc / "self" / "status").write_text("Name:\tpython\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\n")
    assert (resident_bytes(proc), peak_resident_bytes(proc)) == (1024 * 1024, 2048 * 1024)
    assert (resident_bytes(tmp_path), peak_resident_bytes(tmp_path)) == (0, 0)  # unknown


def test_on_this_machine_a_restarted_peak_starts_again_from_the_resident_size() -> None:
    held = bytearray(64 << 20)  # resident now, and then dropped: the peak stays above
    held[::4096] = b"x" * len(held[::4096])
    del held
    assert peak_resident_bytes() > resident_bytes() + (32 << 20)
    assert restart_peak()
    assert peak_resident_bytes() < resident_bytes() + (32 << 20)
