"""A tiny local test model: a 2-layer Llama with random weights and a byte-level BPE tokenizer trained here on
the project's own Python source, with a ChatML chat template. It loads offline like any Hub model folder."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "themisto"
VOCAB_SIZE = 1024
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# ChatML, as SmolLM2 and Qwen use it; `add_generation_prompt` opens the assistant turn.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def _corpus() -> list[str]:
    return [path.read_text(encoding="utf-8") for path in sorted(PACKAGE.rglob("*.py"))]


def build_tiny_model(folder: str | Path, *, seed: int = 0) -> Path:
    """Write the tiny model (config, safetensors weights, tokenizer with chat template) into `folder`."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator(_corpus(), trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                        pad_token="<|endoftext|>", chat_template=CHAT_TEMPLATE)
    tokenizer.save_pretrained(folder)
    # A wide initialisation makes greedy decoding wander over the vocabulary instead of repeating one token.
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=True, initializer_range=0.3,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
                                               pad_token_id=config.pad_token_id)
    model.save_pretrained(folder)
    return folder


# ChatML with tools (the Hermes/Qwen layout): the tools listed in the system turn, a call as <tool_call>{json}
# </tool_call> in the assistant's turn, a tool's answer in a `tool` turn.
TOOL_CHAT_TEMPLATE = (
    "{%- if tools %}{{ '<|im_start|>system\n' }}{% if messages[0]['role'] == 'system' %}"
    "{{ messages[0]['content'] + '\n\n' }}{% endif %}{{ '# Tools\n<tools>' }}{% for tool in tools %}"
    "{{ tool | tojson }}{% endfor %}{{ '</tools>\nCall one as <tool_call>{\"name\": ..., \"arguments\": ...}"
    "</tool_call><|im_end|>\n' }}{% endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' and tools %}"
    "{%- elif message['role'] == 'assistant' and message.get('tool_calls') %}"
    "{{ '<|im_start|>assistant\n' + (message['content'] or '') }}{% for call in message['tool_calls'] %}"
    "{{ '<tool_call>\n' }}{{ {'name': call['function']['name'], 'arguments': call['function']['arguments']} | tojson }}"
    "{{ '\n</tool_call>' }}{% endfor %}{{ '<|im_end|>\n' }}"
    "{%- else %}{{ '<|im_start|>' + message['role'] + '\n' + (message['content'] or '') + '<|im_end|>\n' }}"
    "{%- endif %}{%- endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
# How transformers (`parse_response`, and `transformers serve`) reads the calls back out of a reply.
TOOL_RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "tool_calls": {"open_pattern": r"\s*<tool_call>", "close": "</tool_call>", "repeats": True, "content": "json",
                       "transform": {"type": "function", "function": "{content}"}},
        "content": {"close_pattern": r"\s*(?:<\|im_end\|>|<\|endoftext\|>)", "content": "text"},
    },
}


def _greedy_reply(model, prompt_ids, length: int) -> list[int]:
    import torch

    with torch.no_grad():
        out = model.generate(prompt_ids, attention_mask=torch.ones_like(prompt_ids), max_new_tokens=length,
                             do_sample=False)
    return out[0, prompt_ids.shape[1]:].tolist()


def build_scripted_model(folder: str | Path, reply: str, prompts, *, tools: list[dict] | None = None,
                         steps: int = 150, lr: float = 3e-3, seed: int = 0,
                         max_rounds: int = 5) -> Path:
    """The tiny model, its chat template able to carry tools, trained here (a few hundred steps on the CPU) to
    answer `reply` to each of `prompts(folder)` (chat messages; offered `tools` when given; called once the folder
    holds the tokenizer, so prompts can be counted with it) and to whatever looks like them: a real model whose
    answer a test knows, where a random one would never write a probe or a tool call."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = build_tiny_model(folder, seed=seed)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = TOOL_CHAT_TEMPLATE
    tokenizer.response_template = TOOL_RESPONSE_TEMPLATE
    tokenizer.save_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    # The tiny model's wide initialisation makes it wander (as a random model should); one that learns starts narrow.
    config = model.config
    config.initializer_range, config.hidden_size, config.intermediate_size = 0.02, 128, 256
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.generation_config.pad_token_id = config.pad_token_id
    target = tokenizer(reply + "<|im_end|>", add_special_tokens=False)["input_ids"]
    examples = []
    for messages in prompts(folder):
        prefix = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
        ids = tokenizer(prefix, add_special_tokens=False)["input_ids"]
        examples.append((torch.tensor([ids + target]), len(ids)))
    torch.manual_seed(seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a model this small trains faster on one thread than on a busy machine's many
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    # The prompts carry the replay's timings, so they differ between builds and so does how fast the model learns
    # them: train in rounds until greedy decoding gives the reply on every prompt (a test then checks the harness,
    # not how well this build's prompts happened to train), and say so plainly when it never does.
    for _ in range(max_rounds):
        model.train()
        for step in range(steps):
            ids, start = examples[step % len(examples)]
            labels = ids.clone()
            labels[:, :start] = -100  # the loss is on the reply alone
            loss = model(input_ids=ids, labels=labels).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        model.eval()
        if all(_greedy_reply(model, ids[:, :start], len(target)) == target for ids, start in examples):
            break
    else:
        raise RuntimeError(f"the scripted model did not learn its reply in {max_rounds} x {steps} steps")
    torch.set_num_threads(threads)
    model.save_pretrained(folder)
    return folder
