local i = 0
request = function()
  i = (i + 1) % 99
  return wrk.format("GET", "/r" .. i, {["apikey"] = "key" .. (i + 1)})
end
