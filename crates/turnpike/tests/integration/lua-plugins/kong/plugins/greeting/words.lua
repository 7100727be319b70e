local M = {}

function M.repeated(word, n)
  local out = {}
  for i = 1, n do
    out[i] = word
  end
  return table.concat(out, ",")
end

return M
