import numpy as np, gradloop as gl
from numerics import median_seconds
DT, G, DRAG, SPEED = 0.01, 9.81, 0.05, 30.0
def flight(theta, m=None, speed=SPEED):
    def step(x, y, vx, vy):
        speed = gl.sqrt(vx * vx + vy * vy)
        return (x + DT * vx, y + DT * vy, vx - DT * DRAG * speed * vx, vy - DT * (G + DRAG * speed * vy))
    z = gl.tensor(0.0, dtype=gl.float64)
    x, y, vx, vy = gl.while_loop(lambda x, y, vx, vy: y >= 0.0, step, (z, z, speed * gl.cos(theta), speed * gl.sin(theta)), maximum_iterations=m)
    return x - vx * y / vy
th = gl.tensor(0.3, dtype=gl.float64)
for m in (None, 256):
    g = gl.jit(gl.grad(lambda t: flight(t, m)), backend="xla")
    gg = gl.function(gl.grad(lambda t: flight(t, m)))
    print(m, float(g(th)), float(gg(th)), "xla ms", median_seconds(lambda: g(th), 21)*1e3, "graph ms", median_seconds(lambda: gg(th), 21)*1e3)
# a flight longer than the rows: the fallback
for speed in (300.0, 3000.0):
  g = gl.jit(gl.grad(lambda t: flight(t, None, speed)), backend="xla")
  gg = gl.function(gl.grad(lambda t: flight(t, None, speed)))
  print("speed", speed, float(g(th)), float(gg(th)), "xla ms", median_seconds(lambda: g(th), 5)*1e3)
