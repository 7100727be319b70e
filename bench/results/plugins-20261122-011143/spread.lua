local i = 0
request = function()
  i = (i + 1) % 100
  return wrk.format("GET", "/r" .. i, {["apikey"] = "key-" .. i})
end
