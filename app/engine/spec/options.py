"""How a request speculates, as the CLI (and later the app) states it. No torch here."""

from dataclasses import dataclass

from app.errors import UserError

METHODS = ("off", "dflash", "mtp")


@dataclass(frozen=True)
class SpecOptions:
    """`method`: "off", "dflash" (a DFlash drafter from the folder `drafter`) or "mtp" (the model's own
    MTP layer, GLM); `block_size` forces the positions every step verifies, None lets the cost-aware
    policy choose per step. A combination that makes no sense is a UserError."""

    method: str = "off"
    drafter: str | None = None
    block_size: int | None = None

    def __post_init__(self):
        if self.method not in METHODS:
            raise UserError(f"unknown speculation '{self.method}': use one of {', '.join(METHODS)}")
        if self.method == "off" and (self.drafter or self.block_size):
            raise UserError("--drafter and --block-size only apply with --spec dflash (and --block-size with "
                            "--spec mtp)")
        if self.method == "mtp" and self.drafter:
            raise UserError("--spec mtp drafts with the model's own MTP layer: --drafter is for --spec dflash")
        if self.method == "dflash" and not self.drafter:
            raise UserError("--spec dflash needs the drafter's folder: --drafter DIR")
        if self.block_size is not None and self.block_size < 1:
            raise UserError(f"--block-size {self.block_size}: a step verifies at least 1 position")
