"""One part of a DAPO step against its bound or verl's own code, in the same process: the policy loss
(``loss``), the scorer (``scorer``), a real-model step's prefill, decode, update and optimizer (``step``, with
vLLM-CPU through ``vllm_peer``)."""
