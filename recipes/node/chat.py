"""The one chat format of the console's models: SFT renders its examples with it, the CPU replica its
chat requests, and vLLM gets it as --chat-template where a model folder has none, so a fine-tuned model
is asked in exactly the form it was trained on.

A Hugging Face folder's own `chat_template` (a model born elsewhere, e.g. Llama 3 Instruct's) wins
everywhere; the console's own models carry TEMPLATE in their tokenizer_config.json (train.py's
hf_tokenizer). Rendered with the same Jinja as transformers' apply_chat_template."""

TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}### Question: {{ message['content'] }}\n"
    "{% elif message['role'] == 'assistant' %}### Answer: {{ message['content'] }}\n"
    "{% else %}{{ message['content'] }}\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}### Answer: {% endif %}"
)


def template_of(tokenizer):
    """The chat template a transformers tokenizer carries, else the console's."""
    return getattr(tokenizer, "chat_template", None) or TEMPLATE


def prompt_ids(tokenizer, messages):
    """The token ids a model is asked with: the conversation rendered with the tokenizer's template (or
    the console's) up to the answer's cue, tokenized as it stands (the template places BOS)."""
    text = tokenizer.apply_chat_template(messages, chat_template=template_of(tokenizer), tokenize=False,
                                         add_generation_prompt=True)  # fmt: skip
    return text, tokenizer(text, add_special_tokens=False)["input_ids"]


def render(messages, template=TEMPLATE, bos_token="", add_generation_prompt=True):
    """The conversation as text, as apply_chat_template renders it (jinja2's sandbox, trimmed blocks as
    transformers sets them). Training passes bos_token="" and adds the BOS id itself."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return environment.from_string(template).render(
        messages=messages, bos_token=bos_token, eos_token="", add_generation_prompt=add_generation_prompt
    )
