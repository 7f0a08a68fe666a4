"""What this machine has, found without torch: RAM from the kernel, GPU memory from `nvidia-smi`, cores from the
scheduler."""

import os
import subprocess
from dataclasses import dataclass

from app.plan import CARD_MEMORY_BPS, PCIE_BPS, Hardware
from app.plan_cpu import CPU_HARDWARE
from app.plan_cpu_tier import host_cores

GIB = 1 << 30
_SMI_QUERY = ["nvidia-smi", "--query-gpu=name,memory.total,pcie.link.gen.max", "--format=csv,noheader,nounits"]


@dataclass(frozen=True)
class Machine:
    ram_bytes: int
    gpu_name: str | None = None
    gpu_bytes: int | None = None
    pcie_gen: int | None = None
    more_gpu_bytes: tuple[int, ...] = ()  # memory of every further GPU: the experts can spread over all of them
    cores: int = 1  # the CPU cores the app may run on

    @property
    def device(self) -> str:
        return "cuda" if self.gpu_bytes else "cpu"

    @property
    def dtype(self) -> str:
        return "bfloat16" if self.gpu_bytes else "float32"

    @property
    def device_bytes(self) -> int:
        """Memory of the compute device: the GPU's, or RAM when there is none."""
        return self.gpu_bytes or self.ram_bytes

    @property
    def gpus_bytes(self) -> tuple[int, ...]:
        """Memory of each GPU, the first one's first; empty without a GPU."""
        return (self.gpu_bytes, *self.more_gpu_bytes) if self.gpu_bytes else ()

    @property
    def budget_name(self) -> str:
        """What the device budget is called: the GPU's memory, or (without a GPU) the machine's."""
        return "GPU budget" if self.gpu_bytes else "Memory budget"

    def in_words(self, message: str) -> str:
        """A planner's or engine's message as this window says it: budgets by their slider's name, and no
        GPU named on a machine that has none."""
        message = message.replace("--gpu-budget", "the GPU budget").replace("--ram-budget", "the RAM budget")
        message = message.replace("--cpu-threads 0", "0 CPU threads for experts")
        message = message.replace("--cpu-threads", "the CPU expert tier")
        if not self.gpu_bytes:
            message = message.replace("GPU budget", "memory budget").replace("GPU memory", "memory")
        return message

    @property
    def hardware(self) -> Hardware:
        """The performance model's rates: the card's datasheet bandwidth where its name is known."""
        if not self.gpu_bytes:
            return CPU_HARDWARE
        memory = next((bps for card, bps in CARD_MEMORY_BPS.items() if card in (self.gpu_name or "")), None)
        return Hardware(link_bps=PCIE_BPS.get(self.pcie_gen, PCIE_BPS[4]),
                        memory_bps=memory or Hardware.memory_bps)

    def describe(self) -> str:
        ram = f"{self.ram_bytes / GIB:.0f} GiB RAM"
        if not self.gpu_bytes:
            return f"no NVIDIA GPU found: the model runs on the CPU, in this machine's memory · {ram}"
        gen = f", PCIe Gen{self.pcie_gen}" if self.pcie_gen else ""
        more = "".join(f" + GPU {i} ({size / GIB:.0f} GiB)" for i, size in enumerate(self.more_gpu_bytes, start=1))
        return f"{self.gpu_name} ({self.gpu_bytes / GIB:.0f} GiB{gen}){more} · {ram}"


def detect_machine(run=subprocess.run) -> Machine:
    gpus = _gpus(run)
    if not gpus:
        return Machine(total_ram(), cores=host_cores())
    more = tuple(memory for _, memory, _ in gpus[1:])
    return Machine(total_ram(), *gpus[0], more_gpu_bytes=more, cores=host_cores())


def total_ram() -> int:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _gpus(run) -> list[tuple[str, int, int | None]]:
    """(name, memory bytes, PCIe generation) of every GPU nvidia-smi lists, in its order."""
    try:
        result = run(_SMI_QUERY, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return []
    gpus = []
    for line in result.stdout.strip().splitlines() if result.returncode == 0 else []:
        name, memory_mib, gen = (part.strip() for part in line.split(","))
        gpus.append((name, int(float(memory_mib)) << 20, int(gen) if gen.isdigit() else None))
    return gpus
