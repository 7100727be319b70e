-- bench/custom-plugins.sh: Kong's typical access-phase work as an operator's own plugin.
return {
  name = "bench-lookup",
  fields = {
    { config = {
        type = "record",
        fields = {
          { header = { type = "string", default = "x-key" } },
        },
      },
    },
  },
}
