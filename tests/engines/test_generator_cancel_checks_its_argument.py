"""``Generator.cancel`` takes only a request its own ``submit`` returned (issue 30): anything else is a
ConfigError naming ``request``, and another generator's request is left running."""

import pytest

import refusion
from refusion.errors import ConfigError
from refusion.generator import Generator


@pytest.fixture(scope="module")
def model():
    return refusion.load_model()


@pytest.mark.parametrize("given", [12345, None, "req-1", object()])
def test_anything_but_a_request_is_refused_naming_the_parameter(model, given):
    generator = Generator(model)
    with pytest.raises(ConfigError) as info:
        generator.cancel(given)
    assert info.value.param == "request" and "submit()" in str(info.value)


def test_another_generators_request_is_refused_and_keeps_running(model):
    first, second = Generator(model), Generator(model)
    request = first.submit("rev ab=", gen_length=4)
    with pytest.raises(ConfigError, match="another generator's request"):
        second.cancel(request)
    assert request.wait() is not None and request.status == "finished"
    own = second.submit("rev ab=", gen_length=4)
    second.cancel(own)
    assert own.wait() is None and own.status == "cancelled"
