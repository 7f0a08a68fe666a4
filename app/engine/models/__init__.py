"""One file per architecture; this table maps `model_type` to (config class, model class, expert reader)."""

from app.engine.models import glm, glm4_moe, glm4_moe_lite, glm_moe_dsa, gpt_oss, mla

ARCHITECTURES = {
    "gpt_oss": (gpt_oss.GptOssConfig, gpt_oss.GptOss, gpt_oss.expert_reader),
    "glm4_moe": (glm4_moe.Glm4MoeConfig, glm4_moe.Glm4Moe, glm.expert_reader),
    "glm4_moe_lite": (mla.MlaConfig, glm4_moe_lite.Glm4MoeLite, glm.expert_reader),
    "glm_moe_dsa": (glm_moe_dsa.DsaConfig, glm_moe_dsa.GlmMoeDsa, glm.expert_reader),
}
