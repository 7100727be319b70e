-- A custom plugin sending a request to another host when a header names one. For the tests.
return {
  name = "route-by-header",
  fields = {
    { config = {
        type = "record",
        fields = {
          { header = { type = "string", default = "x-target" } },
        },
      },
    },
  },
}
