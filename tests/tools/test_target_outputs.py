"""The drafter trains on target outputs computed once (tools/demo/target_outputs.py): they must be what the
target itself gives for each row, whatever rows share a pass and however they are padded."""

import torch

from tools.demo import target as targeting
from tools.demo.drafter_data import DrafterData
from tools.demo.target_outputs import TargetOutputs


def test_the_stored_features_and_teacher_logits_are_the_targets_own_for_every_row():
    config = targeting.target_config(smoke=True, vocab_size=512)
    model = targeting.build_target(config, targeting.SMOKE_TRAINING, seed=0).eval()
    generator = torch.Generator().manual_seed(0)
    pairs = [(torch.randint(10, 512, (3,), generator=generator).tolist(),
              torch.randint(10, 512, (length,), generator=generator).tolist()) for length in (20, 5, 33, 12, 27)]
    data = DrafterData.from_pairs(pairs, pad_id=1)
    layer_ids = [0, 2]
    outputs = TargetOutputs.compute(model, data, layer_ids, torch.device("cpu"), rows_per_pass=2)

    rows = torch.tensor([2, 0, 4, 1])
    width = 30
    positions = torch.tensor([[0, 7, 40], [22, 5, 1], [29, 3, 11], [7, 0, 2]])  # 40 and 22: past the row's end
    features = outputs.context(rows, width)
    teacher = outputs.teacher_logits(model, rows, positions)
    for i, row in enumerate(rows.tolist()):
        length = int(data.lengths[row])
        with torch.no_grad():
            own = model(input_ids=data.rows[row: row + 1, :length], output_hidden_states=True)
        expected = torch.cat([own.hidden_states[j + 1] for j in layer_ids], dim=-1)[0]
        seen = min(width, length)
        assert torch.allclose(features[i, :seen], expected[:seen], atol=1e-5)
        assert torch.allclose(features[i, seen:], expected[length - 1].expand(width - seen, -1), atol=1e-5)
        clamped = positions[i].clamp(max=length - 1)
        assert torch.allclose(teacher[i], own.logits[0, clamped], atol=1e-4)
        assert own.logits[0, clamped].std() > 0.1
