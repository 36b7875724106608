"""Faults the thirteenth bad-input catalogue found (tried by someone who did not write the code, on
bcec5eb): each test fails on the code before its fix."""


def test_plan_refuses_a_lora_rank_above_the_hidden_size_as_train_does(capsys):
    """n27: `rlpost plan model.lora.rank=100000` planned 1.81 GiB of adapters and exited 0; `rlpost
    train` with the same key is refused (the twelfth catalogue's t14)."""
    from rlpost.cli import main

    assert main(["plan", "+recipe=quickstart", "model.lora.rank=100000"]) == 2
    assert capsys.readouterr().err == (
        "rlpost plan: model.lora.rank=100000 is above tiny's hidden size (128): the adapters would be larger than "
        "the layers they adapt; give a rank below it (8-64 are usual)\n"
    )
    assert main(["plan", "+recipe=quickstart", "model.lora.rank=128"]) == 0
