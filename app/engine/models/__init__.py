"""One file per architecture; this table maps `model_type` to (config class, model class, expert reader)."""

from app.engine.models import gpt_oss

ARCHITECTURES = {
    "gpt_oss": (gpt_oss.GptOssConfig, gpt_oss.GptOss, gpt_oss.expert_reader),
}
