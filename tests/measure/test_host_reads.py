"""The host-read counter: reads of network data count once, host bookkeeping does not, steps are attributed."""

import torch

from refusion.decoding.decoder import Decoder
from refusion.measure.host_reads import HostReads, format_table
from tests.support.helpers import tiny


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, x):
        return self.linear(x)


def test_reading_a_network_output_counts_and_host_data_does_not():
    net = Net()
    with torch.no_grad(), HostReads(net) as reads:
        out = net(torch.ones(2, 4))
        out.sum().item()  # arithmetic on network data, then a read: 1
        (out.argmax(-1) + 1).tolist()  # 1
        bool((out > 0).any())  # 1
        plain = torch.arange(5)
        plain.sum().item()  # pure host data: 0
        int(plain[2]), plain.tolist()  # 0
        host = out.cpu()  # the copy to the host: 1
        host.tolist(), float(host[0, 0])  # reading the host copy: 0
    assert reads.by_kind == {"item": 1, "tolist": 1, "__bool__": 1, "cpu": 1}
    assert reads.total == 4
    assert reads.forwards == 1


def test_in_place_writes_and_mixed_inputs_carry_the_tag():
    net = Net()
    with torch.no_grad(), HostReads(net) as reads:
        out = net(torch.ones(3, 4))
        buffer = torch.zeros(3)
        buffer[1:] = out[1:, 0]  # a host buffer now holds network data
        mixed = torch.cat([torch.ones(3), out[:, 1]])
        buffer.tolist(), mixed.max().item()
        picked = torch.arange(3)[out[:, 2] > 0]  # a boolean index whose size depends on network data
        torch.equal(out, out), 1 in out.argmax(-1), f"{out[0, 0]:.3f}", [0, 1, 2][out.argmax(-1)[0]]
        out.numpy()
    assert reads.by_kind == {
        "tolist": 1,
        "item": 1,
        "bool-index": 1,
        "equal": 1,
        "__contains__": 1,
        "__format__": 1,
        "__index__": 1,
        "numpy": 1,
    }
    assert picked.dim() == 1


def test_tensors_made_on_the_device_are_placed_and_follow_the_device_they_were_given():
    net = Net()
    with torch.no_grad():
        kept = net(torch.ones(1, 4))
    host = torch.arange(3)
    with torch.no_grad(), HostReads(net) as reads:
        device = next(net.parameters()).device  # the weights live on the device
        out = net(torch.ones(2, 4))
        assert device == out.device != host.device
        torch.zeros(2, device=out.device).tolist()  # placed by the code: counted apart
        ids = host.to(device)  # an upload: ids is device data, host stays host data
        int(ids[0]), host.tolist()
        torch.zeros(2, device=host.device).tolist()  # made beside host data: not counted
        out.to(host.device).tolist()  # a copy of network data to the host: 1
        kept.sum().item()  # tagged by no context: not counted
    assert reads.by_kind == {"cpu": 1}
    assert reads.placed == {"tolist": 1, "__int__": 1}
    assert not any(hasattr(p, reads._attr) for p in net.parameters())
    with torch.no_grad(), HostReads(net, placed=False) as reads:
        out = net(torch.ones(2, 4))
        torch.zeros(2, device=out.device).tolist()
        out.to(out.device).sum().item()
    assert reads.by_kind == {"item": 1} and reads.placed_total == 0


def test_sites_name_the_first_refusion_frame():
    net = Net()
    with torch.no_grad(), HostReads(net) as reads:
        net(torch.ones(1, 4)).sum().item()
    ((count, kind, site),) = reads.top_sites()
    assert (count, kind) == (1, "item") and "test_host_reads.py" in site


def test_a_decode_is_attributed_to_engine_steps():
    adapter = tiny(vocab=24, scale=8.0)
    decoder = Decoder.from_names(serial_num_blocks=1, slot_size=4, slot_threshold=0.7, token_threshold=0.5)
    prompts = [[1, 2, 3], [4, 5, 6, 7]]
    alone = decoder.decode_batch(adapter, prompts, 12, engine="branch")
    before = adapter.forwards
    with HostReads(adapter) as reads:
        results = decoder.decode_batch(adapter, prompts, 12, engine="branch")
    assert [r.tokens.tolist() for r in results] == [r.tokens.tolist() for r in alone]  # measuring changes nothing
    engine_forwards = results[0].engine_totals["forwards"]
    assert reads.forwards == adapter.forwards - before == engine_forwards
    assert len(reads.steps) == engine_forwards == sum(s.forwards for s in reads.steps)
    assert all(s.sequences in (1, 2) for s in reads.steps)
    assert reads.total > 0 and reads.step_reads + (reads.total - reads.step_reads) == reads.total
    assert reads.per_step == reads.step_reads / len(reads.steps)
    summary = reads.summary()
    assert summary["steps"] == len(reads.steps) and summary["top_sites"]
    assert all(row["site"].startswith("refusion/") for row in summary["top_sites"])
    table = format_table([dict(summary, label="tiny", batch=2)])
    assert "/seq/step" in table and "tiny" in table


def test_the_context_restores_the_engine_and_driver():
    from refusion.decoding.loop import DecodeLoop as Runner
    from refusion.engines.base import Engine

    scores, step = Engine.run_network, Runner.step
    with HostReads():
        assert Engine.run_network is not scores and Runner.step is not step
    assert Engine.run_network is scores and Runner.step is step
